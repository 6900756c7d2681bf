"""On-policy distillation (algos/distill.py): the advantage's gradient against the analytic reverse KL by exact
enumeration, the log-probs each --opd_student_logprobs puts in the reward, environment tokens left unscored, the
flags in both spellings and the bad inputs that stop a run in one line."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from reinforce_pro.algos.distill import DistillConfig, distill_advantages, distill_metrics
from reinforce_pro.algos.losses import PolicyLoss

# ------------------------------------------------------------------------------------ the gradient, enumerated


def _sampled_token_gradient(student_logits: torch.Tensor, teacher_lp: torch.Tensor, steps: int) -> torch.Tensor:
    """E_{y ~ S}[grad of PolicyLoss on y with the distillation advantage], summed exactly over every sequence of
    `steps` tokens. student_logits / teacher_lp: (steps, V), one distribution per position (the same whatever the
    prefix: enough to tell the per-token advantage from a reward-to-go one)."""
    theta = student_logits.clone().requires_grad_(True)
    s_lp = theta.log_softmax(-1)
    v = theta.size(-1)
    total = torch.zeros(())
    for ys in itertools.product(range(v), repeat=steps):
        idx = torch.tensor(ys)
        lp = s_lp[torch.arange(steps), idx].unsqueeze(0)  # (1, steps) with grad
        old = lp.detach()
        adv = distill_advantages(teacher_lp[torch.arange(steps), idx].unsqueeze(0), old, torch.ones(1, steps))
        loss, _ = PolicyLoss()(lp, old, adv, torch.ones(1, steps, dtype=torch.bool))
        total = total + old.sum().exp() * loss  # weighted by the sequence's probability under S (no grad)
    (grad,) = torch.autograd.grad(total, theta)
    return grad


def test_sampled_token_advantage_has_the_reverse_kl_gradient_in_expectation():
    """One token, V = 7: E_{y~S}[grad PolicyLoss] = grad KL(S || T) exactly (the loss descends the KL)."""
    gen = torch.Generator().manual_seed(0)
    student = torch.randn(1, 7, generator=gen, dtype=torch.float64).float()
    teacher_lp = torch.randn(1, 7, generator=gen).log_softmax(-1)
    got = _sampled_token_gradient(student, teacher_lp, steps=1)
    theta = student.clone().requires_grad_(True)
    s_lp = theta.log_softmax(-1)
    kl = (s_lp.exp() * (s_lp - teacher_lp)).sum()
    (want,) = torch.autograd.grad(kl, theta)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert want.abs().max() > 1e-2  # a gradient that is not trivially zero


def test_per_token_advantage_over_a_sequence_is_the_sum_of_each_positions_kl_gradient():
    """Three tokens, V = 4: the undiscounted per-token advantage (slime's, prime-rl's, Tinker's) descends the sum
    over positions of KL(S_t || T_t), each position's own term: token-mean over 3 tokens divides it by 3. With
    position-independent distributions this is also the whole sequence's reverse KL."""
    gen = torch.Generator().manual_seed(1)
    student = torch.randn(3, 4, generator=gen)
    teacher_lp = torch.randn(3, 4, generator=gen).log_softmax(-1)
    got = _sampled_token_gradient(student, teacher_lp, steps=3)
    theta = student.clone().requires_grad_(True)
    s_lp = theta.log_softmax(-1)
    kl = (s_lp.exp() * (s_lp - teacher_lp)).sum() / 3
    (want,) = torch.autograd.grad(kl, theta)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------- the advantage and its metrics


def test_advantage_is_teacher_minus_student_on_action_tokens_only():
    teacher = torch.tensor([[-1.0, -2.0, -0.5, float("nan")]])
    student = torch.tensor([[-1.5, -1.0, -0.5, -1.0]])
    mask = torch.tensor([[True, True, False, True]])
    adv = distill_advantages(teacher, student, mask)
    assert adv.tolist() == [[0.5, -1.0, 0.0, 0.0]]  # masked and non-finite tokens carry nothing
    m = distill_metrics(teacher, student, mask, "k1")
    assert m["opd/reverse_kl_k1"] == pytest.approx((-0.5 + 1.0) / 2)
    assert m["opd/reverse_kl"] == m["opd/reverse_kl_k1"]
    assert m["opd/nonfinite_frac"] == pytest.approx(1 / 3)
    assert m["opd/teacher_logprob_mean"] == pytest.approx(-1.5)
    assert m["opd/reverse_kl_k3"] >= 0 and m["opd/reverse_kl_k2"] >= 0


def _builder(monkeypatch, distill: DistillConfig, old: torch.Tensor, teacher: torch.Tensor, rewards: list[float]):
    """An ExperienceBuilder whose policy and teacher groups answer from tensors (no Ray)."""
    from reinforce_pro.algos.kl import build_kl_controller
    from reinforce_pro.trainer import experience_builder as eb

    def fake_call(group, method, sequences, attention_mask, num_actions, routes=None):
        if group == "policy" and method == "score":
            return {"log_probs": old, "outside": torch.zeros_like(old)}
        if group == "teacher" and method == "log_probs":
            return teacher
        raise AssertionError(f"unexpected call {group}.{method}")

    monkeypatch.setattr(eb, "_sharded_call", fake_call)
    cfg = eb.ExperienceConfig(advantage_estimator="reinforce", reward_clip_range=None, std_norm=False)
    reward_fn = lambda queries, prompts, labels: rewards  # noqa: E731
    return eb.ExperienceBuilder("policy", None, None, reward_fn, cfg, build_kl_controller(0.0, None, 1), "teacher",
                                distill)  # fmt: skip


def _samples(mask: torch.Tensor, rollout: torch.Tensor):
    from reinforce_pro.experience import Samples

    b, t = mask.shape
    return Samples(
        torch.zeros(b, t + 2, dtype=torch.long), torch.ones(b, t + 2, dtype=torch.long), mask, rollout,
        ["p"] * b, ["r"] * b, [None] * b, torch.arange(b), torch.zeros(b, dtype=torch.bool),
    )  # fmt: skip


@pytest.mark.parametrize("which", ["trainer", "engine"])
def test_the_reward_uses_the_student_log_probs_the_flag_names(monkeypatch, which):
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
    rollout = old + torch.tensor([[0.1, -0.2, 0.3], [0.05, 0.0, -0.05]])  # the engine's, off by a mismatch
    teacher = torch.tensor([[-0.5, -2.5, -1.0], [-1.0, -0.2, -0.4]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    distill = DistillConfig(teacher_pretrain="t", opd_kl_coef=0.5, opd_task_coef=2.0, opd_student_logprobs=which)
    builder = _builder(monkeypatch, distill, old, teacher, rewards=[1.0, 0.0])
    assert builder.needs_old_log_probs() == (which == "trainer")
    samples = _samples(mask, rollout)
    exp, metrics = builder.make_experience(samples, old_log_probs=True)
    student = old if which == "trainer" else rollout
    task, _ = builder.advantages(samples, torch.tensor([1.0, 0.0]), None, None)  # the task reward's own
    assert task.abs().sum() > 0
    want = 2.0 * task + 0.5 * (teacher - student) * mask
    torch.testing.assert_close(exp.advantages, want)
    assert metrics["opd/reverse_kl_k1"] == pytest.approx(float((student - teacher)[mask].mean()), abs=1e-6)


def test_environment_tokens_are_not_scored(monkeypatch):
    """An agent's environment tokens sit in the response with action_mask 0: the teacher's log-probs there (here
    wildly off) change neither the advantage nor the metrics."""
    old = torch.full((1, 6), -1.0)
    teacher = torch.tensor([[-1.0, -50.0, -50.0, -1.5, -50.0, -0.5]])
    mask = torch.tensor([[True, False, False, True, False, True]])  # model, env, env, model, env, model
    distill = DistillConfig(teacher_pretrain="t", opd_task_coef=0.0)
    builder = _builder(monkeypatch, distill, old, teacher, rewards=[0.0])
    exp, metrics = builder.make_experience(_samples(mask, old.clone()), old_log_probs=True)
    assert exp.advantages.tolist() == [[0.0, 0.0, 0.0, -0.5, 0.0, 0.5]]
    assert metrics["opd/reverse_kl_k1"] == pytest.approx(0.0)
    assert metrics["opd/teacher_logprob_mean"] == pytest.approx(-1.0)


# ------------------------------------------------------------------------------------------ flags, bad inputs


def _parse(*argv):
    from reinforce_pro.cli.args import build_parser, first_problem

    parser = build_parser()
    args = parser.parse_args(list(argv))
    return args, first_problem(args, parser)


@pytest.mark.parametrize(
    "argv",
    [
        ("--teacher.model_name_or_path", "T", "--opd_kl_coef", "0.5", "--opd_task_coef", "0",
         "--opd.kl_estimator", "k1", "--opd.kd_temperature", "2", "--opd_student_logprobs", "engine"),
        ("--teacher_pretrain", "T", "--opd_kl_coef", "0.5", "--opd_task_coef", "0", "--opd_kl_estimator", "k1",
         "--opd_kd_temperature", "2", "--opd_student_logprobs", "engine"),
    ],
    ids=["dotted", "flat"],
)  # fmt: skip
def test_distillation_flags_in_both_spellings(argv):
    from reinforce_pro.cli.flags_to_config import run_config

    args, problem = _parse(*argv)
    assert problem is None
    d = run_config(args).distill
    assert d == DistillConfig(teacher_pretrain="T", opd_kl_coef=0.5, opd_task_coef=0.0, opd_kl_estimator="k1",
                              opd_kd_temperature=2.0, opd_student_logprobs="engine")  # fmt: skip


def test_no_teacher_no_distill_section():
    from reinforce_pro.cli.flags_to_config import run_config

    args, problem = _parse()
    assert problem is None and run_config(args).distill is None


@pytest.mark.parametrize(
    "argv, says",
    [
        (("--opd_kl_coef", "0.5"), "--opd_kl_coef set without a teacher"),
        (("--opd_student_logprobs", "engine", "--opd.kd_temperature", "2"),
         "--opd.kd_temperature, --opd_student_logprobs set without a teacher"),
        (("--teacher.model_name_or_path", "T", "--opd.topk", "8"), "--opd.topk 8: the top-K reverse KL is not built"),
        (("--teacher.model_name_or_path", "T", "--absolute_zero", "--n_samples_per_prompt", "4"),
         "distilling self-play's roles is not built"),
        (("--teacher.model_name_or_path", "builtin", "--pretrain", "P"), "give it without --pretrain"),
        (("--teacher.model_name_or_path", "T", "--opd.kd_temperature", "0"), "opd_kd_temperature"),
    ],
)  # fmt: skip
def test_bad_distillation_flags_one_line(argv, says):
    _, problem = _parse(*argv)
    assert problem is not None and says in problem and "\n" not in problem


def test_prompt_data_without_reward_is_accepted_with_a_teacher():
    _, problem = _parse("--prompt_data", "x.jsonl")
    assert problem is not None and "needs a reward" in problem
    _, problem = _parse("--prompt_data", "x.jsonl", "--teacher.model_name_or_path", "T")
    assert problem is None


def _model_dir(path, arch="Qwen2ForCausalLM", vocab_extra=None):
    from reinforce_pro.models.tiny import build_tiny_model, build_tokenizer

    build_tiny_model(path, hidden_size=32, num_layers=1, intermediate_size=64)
    if arch != "Qwen2ForCausalLM":
        config = json.loads((path / "config.json").read_text())
        config["architectures"] = [arch]
        (path / "config.json").write_text(json.dumps(config))
    if vocab_extra:
        tok = build_tokenizer()
        tok.add_tokens(vocab_extra)
        tok.save_pretrained(path)
    return path


def test_bad_teachers_stop_in_one_line(tmp_path):
    from reinforce_pro.run.errors import UserInputError
    from reinforce_pro.run.teacher import check_teacher

    student = str(_model_dir(tmp_path / "student"))
    cases = {
        str(tmp_path / "missing"): "not a local HF model directory",
        str(_model_dir(tmp_path / "classifier", arch="Qwen2ForSequenceClassification")): "not a causal language",
        str(_model_dir(tmp_path / "other_vocab", vocab_extra=["<extra>"])): "vocabulary differs from the policy's",
    }
    for path, says in cases.items():
        with pytest.raises(UserInputError) as e:
            check_teacher(path, student, "bf16")
        assert says in str(e.value) and "\n" not in str(e.value)
    check_teacher(student, student, "bf16")  # the student itself is a valid teacher


def test_teacher_larger_than_free_memory_is_refused(tmp_path, monkeypatch):
    from reinforce_pro.run import teacher as t
    from reinforce_pro.run.errors import UserInputError

    student = str(_model_dir(tmp_path / "student"))
    params = t.parameter_count(student)
    need = params * 2  # bf16
    assert need > 0
    monkeypatch.setattr(t, "free_memory", lambda: (need - 1, "in host memory"))
    with pytest.raises(UserInputError, match="more than the .* GiB free in host memory"):
        t.check_teacher(student, student, "bf16")
    monkeypatch.setattr(t, "free_memory", lambda: (need, "in host memory"))
    assert t.check_teacher(student, student, "bf16") == params


# ------------------------------------------------------------------------------------- the engine-served teacher


def test_engine_teacher_maps_each_rows_scored_tokens_back_to_its_response_columns(monkeypatch):
    """Rows left-padded before the prompt and right-padded after the response (and one with a masked hole) go to
    the engines as the tokens the attention mask keeps, split over two engines; each log-prob lands in its
    token's response column, padding columns stay 0."""
    from reinforce_pro.rollout import teacher_engines as te

    pad = 0
    seq = torch.tensor([
        [pad, pad, 5, 6, 7, 8, 9, pad],  # prompt 5 6, response 7 8 9, one pad
        [3, 4, 5, 6, 7, 8, 9, 10],  # prompt 3 4 5 6, response 7 8 9 10
        [pad, 11, 12, 13, pad, 15, pad, pad],  # a hole in the response (masked), then padding
    ])  # fmt: skip
    attn = (seq != pad).long()
    t = 4  # the last 4 columns are the response

    class FakeEngine:
        def __init__(self):
            self.calls = []

        @property
        def score(self):
            engine = self

            class Remote:
                @staticmethod
                def remote(sequences, starts):
                    engine.calls.append(len(sequences))
                    return [[-float(i) for i in ids[s:]] for ids, s in zip(sequences, starts, strict=True)]

            return Remote

    monkeypatch.setattr(te.ray, "get", lambda futures: futures)
    engines = [FakeEngine(), FakeEngine()]
    got = te.EngineTeacher(engines).log_probs(seq, attn, t)
    want = torch.where(attn[:, -t:].bool(), -seq[:, -t:].float(), 0.0)
    assert torch.equal(got, want)
    assert [e.calls for e in engines] == [[2], [1]]
    ids, start, columns = te.row_request(seq[2], attn[2], t)
    assert ids == [11, 12, 13, 15] and start == 3 and columns == [1]


def test_engine_teacher_needs_temperature_one():
    _, problem = _parse("--teacher.model_name_or_path", "T", "--teacher_backend", "engine", "--opd.kd_temperature", "2")
    assert problem is not None and "needs --teacher_backend actor" in problem
    _, problem = _parse(
        "--teacher.model_name_or_path", "T", "--teacher_backend", "engine", "--teacher_num_engines", "2"
    )
    assert problem is None


def test_the_builtin_teacher_is_made_once_and_reused(tmp_path, monkeypatch):
    """The built-in teacher is made under $REINFORCE_PRO_CACHE on first use (here a 2-step recipe), recorded in
    teacher.json, and a second call returns it without training again; a half-made directory is never reused."""
    from reinforce_pro.run import teacher as t
    from reinforce_pro.trainer import sft_warmup

    monkeypatch.setenv("REINFORCE_PRO_CACHE", str(tmp_path))
    monkeypatch.setattr(t, "BUILTIN_TEACHER", {**t.BUILTIN_TEACHER, "hidden_size": 32, "intermediate_size": 64,
                                               "steps": 2, "target": 0.0})  # fmt: skip
    calls = []
    real = sft_warmup.embedded_warm_start
    monkeypatch.setattr(sft_warmup, "embedded_warm_start", lambda *a, **k: calls.append(a) or real(*a, **k))
    name = f"arithmetic-h32-l4-v{t.BUILTIN_TEACHER['version']}"
    (tmp_path / "teachers" / f".{name}.building").mkdir(parents=True)  # a crashed earlier attempt
    first = t.builtin_teacher("arithmetic")
    assert first.name == name and len(calls) == 1
    assert json.loads((first / "teacher.json").read_text())["sft/steps"] == 2
    assert not list((tmp_path / "teachers").glob(".*.building"))
    assert t.builtin_teacher("arithmetic") == first and len(calls) == 1
    t.check_teacher(str(first), str(first), "fp32")


def test_the_reverse_kl_metrics_are_not_clamped():
    """A teacher 30 nats away is reported as 30 (the KL penalty's estimators clamp at 10; the advantage never is)."""
    student = torch.tensor([[-0.1, -0.2]])
    teacher = torch.tensor([[-30.1, -0.2]])
    m = distill_metrics(teacher, student, torch.ones(1, 2, dtype=torch.bool), "k3")
    assert m["opd/reverse_kl_k1"] == pytest.approx(15.0)
    assert m["opd/reverse_kl_k2"] == pytest.approx(30.0**2 / 2 / 2)
    assert m["opd/reverse_kl_k3"] == pytest.approx((math.exp(-30.0) - 1 + 30.0) / 2)
    assert m["opd/student_logprob_mean"] - m["opd/teacher_logprob_mean"] == pytest.approx(m["opd/reverse_kl_k1"])
