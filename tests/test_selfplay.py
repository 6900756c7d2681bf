"""Self-play without Ray or a model: the pure learnability functions, the tasks, and the repropose loop
driven by a scripted fake engine."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from reinforce_pro.selfplay.builtin_tasks import ArithmeticTask, CodeOutputTask, load_task
from reinforce_pro.selfplay.controller import Rollout, SelfPlayConfig, SelfPlayController
from reinforce_pro.selfplay.learnability import (
    combined_reward,
    is_learnable,
    plan_question_sampling,
    proposer_reward,
    question_reward,
    solver_reward,
)
from reinforce_pro.selfplay.sandbox import run_deterministic
from reinforce_pro.selfplay.tasks import role_sampling

# ---------------------------------------------------------------------------------------------- is_learnable

TWO_DIMS = {"safety": (0.5, 0.25, 0.75), "completion": (1.0, 0.0, 0.5)}


@pytest.mark.parametrize(
    "scores, expected",
    [
        pytest.param({"safety": [1, 0, 1, 0], "completion": [1, 0, 0, 0]}, True, id="both-within"),
        pytest.param({"safety": [1, 1, 1, 1], "completion": [1, 0, 0, 0]}, False, id="safety-all-pass"),
        pytest.param({"safety": [0, 0, 0, 0], "completion": [0, 0, 0, 0]}, False, id="safety-none-pass"),
        pytest.param({"safety": [1, 0, 0, 0], "completion": [0, 0, 0, 0]}, True, id="edges-inclusive"),
        pytest.param({"safety": [0.6, 0.4, 0.5, 0.49], "completion": [0.99] * 4}, True, id="threshold-is-ge"),
        pytest.param({"safety": [1, 0, 1, 0], "completion": [1, 1, 1, 0]}, False, id="completion-too-high"),
        pytest.param({"safety": [1, 0, 1, 0]}, False, id="missing-dimension"),
        pytest.param({"safety": [], "completion": []}, False, id="no-responses"),
    ],
)
def test_is_learnable(scores, expected):
    assert is_learnable(scores, TWO_DIMS) is expected


# ---------------------------------------------------------------------------------------------- sampling plan


def test_plan_all_none_mixed():
    rows = [[True, True, True], [False, False, False], [False, True, False], [True, False, True], []]
    plan = plan_question_sampling(rows, random.Random(0))
    assert plan[:2] == [-1, -1]
    assert plan[2] == 1  # the only learnable one
    assert plan[3] in (0, 2)
    assert plan[4] == -1


def test_plan_samples_learnable_questions_uniformly():
    rng = random.Random(1)
    counts = {0: 0, 2: 0, 3: 0}
    for _ in range(3000):
        counts[plan_question_sampling([[True, False, True, True]], rng)[0]] += 1
    assert all(900 < c < 1100 for c in counts.values()), counts


# ---------------------------------------------------------------------------------------------- rewards


@pytest.mark.parametrize(
    "sampled, row, unresolved, expected",
    [
        pytest.param(1, [False, True], False, 1.0, id="sampled-learnable"),
        pytest.param(0, [False, True], False, 0.0, id="sampled-not-learnable"),
        pytest.param(-1, [True, True], True, -0.5, id="unresolved"),
        pytest.param(-1, [False, False], False, -0.5, id="negative-index-is-unresolved"),
    ],
)
def test_proposer_reward(sampled, row, unresolved, expected):
    assert proposer_reward(sampled, row, unresolved) == expected


def test_question_and_solver_rewards():
    assert question_reward(valid=False, learnable=False, format_penalty=-1.0) == -1.0
    assert question_reward(valid=True, learnable=True, format_penalty=-1.0) == 1.0
    assert question_reward(valid=True, learnable=False, format_penalty=-1.0) == 0.0
    weights = {"safety": 0.7, "completion": 0.3}
    r = solver_reward({"safety": 1.0, "completion": 0.5}, weights, format_reward=1.0, format_coef=0.5)
    assert r == pytest.approx(0.7 + 0.15 + 0.5, abs=1e-12)
    assert combined_reward(r, -0.5, 0.1) == pytest.approx(1.35 - 0.05, abs=1e-12)


# ---------------------------------------------------------------------------------------------- tasks


def test_arithmetic_task_parse_and_score():
    task = ArithmeticTask()
    assert task.proposer_prompt({"input": "3+4="}) == "[3+4]>"
    parsed = task.parse_question(" 12+7 ")
    assert parsed.valid and parsed.question.answer == "19" and task.solver_prompt(parsed.question) == "12+7="
    # open-ended: more terms, more digits, - and * with the usual precedence
    for text, answer in [("1+2+3", "6"), ("123+4", "127"), ("37-8*4+120", "125"), ("3-9", "-6"), ("0*7", "0"),
                         ("9999*9999", "99980001"), ("2*3*4-1", "23")]:  # fmt: skip
        parsed_ok = task.parse_question(text)
        assert parsed_ok.valid and parsed_ok.question.answer == answer, text
    for bad in ("12+", "a+b", "7", "05+1", "12345+1", "1+2+3+4+5", "1++2", "-3+4", "1 + 2", ""):
        assert not task.parse_question(bad).valid, bad
    too_long = task.parse_question("9999*9999*99")
    assert not too_long.valid and "longer than 8 characters" in too_long.reason
    scored = task.score(parsed.question, ["19", " 19", "18", "x9"])
    assert scored.scores["completion"] == [1.0, 1.0, 0.0, 0.0]
    assert scored.format == [1.0, 1.0, 1.0, 0.0]
    assert task.score(task.parse_question("3-9").question, ["-6", "6", "--6"]).format == [1.0, 1.0, 0.0]
    assert task.difficulty(task.parse_question("37-8*4+120").question) == {
        "digits": 3.0, "terms": 4.0, "answer_digits": 3.0, "sub": 1.0, "mul": 1.0,
    }  # fmt: skip


def test_evaluate_expression_follows_python_precedence():
    from reinforce_pro.selfplay.builtin_tasks import evaluate_expression

    rng = random.Random(0)
    for _ in range(500):
        terms = [str(rng.randint(0, 999)) for _ in range(rng.randint(2, 4))]
        text = terms[0] + "".join(rng.choice("+-*") + t for t in terms[1:])
        assert evaluate_expression(text) == eval(text), text  # a generated digits-and-operators string


def test_ladder_is_fixed_and_the_warm_start_is_valid():
    from reinforce_pro.selfplay.builtin_tasks import evaluate_expression, propose_variant

    task = ArithmeticTask()
    ladder = task.ladder()
    assert ladder == ArithmeticTask().ladder()  # the same questions in every run
    assert set(task.warm_start_levels) < set(ladder) and all(len(qs) == 40 for qs in ladder.values())
    for questions in ladder.values():
        assert all(task.parse_question(q.text).question == q for q in questions)
    examples = task.warm_start_examples(500, seed=3)
    solver, proposer = examples[0::2], examples[1::2]
    assert all(str(evaluate_expression(e["prompt"].rstrip("="))) == e["label"] for e in solver)
    assert all(task.parse_question(e["label"]).valid for e in proposer)
    assert all(e["label"] != e["prompt"][1:-2] for e in proposer)  # a variant, never the reference itself
    rng = random.Random(1)
    variants = [propose_variant("37+45", rng) for _ in range(200)]
    assert all(v != "37+45" and task.parse_question(v).valid for v in variants)
    assert sum(v.startswith("37+") for v in variants) > 40  # operands move one at a time, not all at once


def test_code_output_task_runs_the_sandbox():
    """A proposal continues "def f(": the function, then `assert f(<literal>) == ...` (the proposer's claimed
    output is ignored: the sandbox decides); the solver completes "assert f(<input>) ==" on one line."""
    task = CodeOutputTask()
    parsed = task.parse_question("x):\n    return x * 3\nassert f([1, 2]) == 'anything'\n\nmore text")
    assert parsed.valid and parsed.question.answer == "[1, 2, 1, 2, 1, 2]"
    assert task.solver_prompt(parsed.question) == "def f(x):\n    return x * 3\nassert f([1, 2]) == "
    scored = task.score(parsed.question, ["[1, 2, 1, 2, 1, 2]", "[1,2,1,2,1,2]\nnext", "[3, 6]", "1 + 2", "(1, 2)"])
    assert scored.scores["completion"] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert scored.format == [1.0, 1.0, 1.0, 0.0, 1.0]
    hostile = task.parse_question("x):\n    import os\n    return os.listdir('/')\nassert f(1) == 1")
    assert not hostile.valid and "os" in hostile.reason
    for bad, reason in [
        ("x):\n    return x\nprint(f(1))", "assert f(<input>)"),  # no assert line
        ("x):\n    return x\nassert f(not_literal) == 1", "one Python literal"),
        ("x):\n    return x\nassert f(1, 2) == 1", "one Python literal"),
        ("x):\n    return x\nassert g(1) == 1", "assert f(<input>)"),
        ("x):\n    return 'a' * 100\nassert f(1) == 1", "over 60"),  # the solver could not write it
        ("x):\n    return x +\nassert f(1) == 1", "syntax error"),
    ]:
        verdict = task.parse_question(bad)
        assert not verdict.valid and reason in verdict.reason, (bad, verdict.reason)


def test_code_output_prompts_show_two_solved_examples_and_budget_each_role():
    task = CodeOutputTask()
    record = {"code": "def f(n):\n    return n + 1", "input": "4"}  # a --prompt_data row: its output is computed
    prompt = task.proposer_prompt(record)
    assert prompt.startswith("def f(n):\n    return n + 1\nassert f(4) == 5\n\n") and prompt.endswith("\ndef f(")
    assert prompt.count("assert f(") == 2
    broken = task.proposer_prompt({"code": "def f(n):\n    return n +", "input": "4"})  # shown without an assert
    assert broken.startswith("def f(n):\n    return n +\n\n") and broken.count("assert f(") == 1
    question = task.parse_question("s):\n    return s[::-1]\nassert f('ab') == 'ba'").question
    assert task.proposer_prompt(task.reference_record(question)).startswith(f"{question.text} 'ba'\n\n")
    assert task.sampling["solver"]["stop"] == ["\n"] and task.sampling["proposer"]["max_tokens"] >= 96
    assert task.difficulty(question) == {"lines": 2.0, "loops": 0.0, "answer_chars": 4.0}


def test_code_output_ladder_is_fixed_and_answers_are_the_programs_outputs():
    ladder = CodeOutputTask().ladder()
    assert list(ladder) == ["arith", "branch", "string", "list", "loop"]
    assert all(len(items) == 24 and len({q.text for q in items}) > 8 for items in ladder.values())
    assert CodeOutputTask().ladder() == ladder  # the same questions in every run
    loop = ladder["loop"][0]  # the sandbox agrees with the in-process answers
    assert run_deterministic(loop.meta["code"], "f", loop.meta["input"]).output == loop.answer


def test_load_task_from_file(tmp_path):
    path = tmp_path / "mytask.py"
    path.write_text(
        "from reinforce_pro.selfplay.builtin_tasks import ArithmeticTask\n"
        "class Mine(ArithmeticTask):\n    name = 'mine'\nTASK = Mine()\n"
    )
    assert load_task(None, str(path)).name == "mine"
    assert load_task("code_output", None).name == "code_output"
    with pytest.raises(ValueError, match="built-in tasks: arithmetic, search, code_output"):
        load_task("nope", None)
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="define TASK"):
        load_task(None, str(tmp_path / "empty.py"))


def test_a_task_file_may_not_reshape_a_roles_sampling_distribution(tmp_path):
    """The trainer replays the run's temperature and filters on every row; a role sampled with its own top-p
    (or penalty) would be scored under a distribution it was not drawn from: refused in one line."""
    path = tmp_path / "mytask.py"
    base = "from reinforce_pro.selfplay.builtin_tasks import ArithmeticTask\nclass Mine(ArithmeticTask):\n"
    path.write_text(base + "    sampling = {'solver': {'max_tokens': 8, 'stop': ['x']}}\nTASK = Mine()\n")
    assert load_task(None, str(path)).sampling["solver"]["max_tokens"] == 8
    path.write_text(base + "    sampling = {'solver': {'top_p': 0.5, 'repetition_penalty': 1.2}}\nTASK = Mine()\n")
    with pytest.raises(ValueError, match=r"TASK.sampling\['solver'\] sets repetition_penalty, top_p, which would"):
        load_task(None, str(path))


# ---------------------------------------------------------------------------------------------- repropose loop

N = 4  # solver responses per question
# question -> how many of the N solver responses are right
SOLVED = {"1+1": 2, "2+2": 4, "3+3": 4, "4+4": 4, "5+5": 1, "9+9": 0, "8+8": 0}
# (seed prompt, attempt) -> the proposer's question group
SCRIPT = {
    ("[1+0]>", 1): ["1+1", "2+2"],  # mixed: resolved at once
    ("[2+0]>", 1): ["3+3", "4+4"],  # both always solved: none learnable -> re-proposed
    ("[2+0]>", 2): ["5+5", "oops"],  # 5+5 learnable, "oops" invalid -> resolved, sampled 0
    ("[3+0]>", 1): ["9+9", "8+8"],  # never solved: re-proposed until the limit
    ("[3+0]>", 2): ["9+9", "8+8"],
    ("[3+0]>", 3): ["9+9", "8+8"],
    ("[3+0]>", 4): ["9+9", "8+8"],
}


class ScriptedEngine:
    """Proposer prompts get SCRIPT's questions (the k-th request of a prompt gets question k % 2 of attempt
    k // 2 + 1); solver prompts get SOLVED[q] right answers, then wrong ones. Records every call."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.served: dict[str, int] = {}

    def __call__(self, prompts: list[str], sampling: dict | None = None) -> list[Rollout]:
        self.calls.append(list(prompts))
        out = []
        for prompt in prompts:
            k = self.served.get(prompt, 0)
            self.served[prompt] = k + 1
            if prompt.startswith("["):
                out.append(Rollout(prompt, SCRIPT[(prompt, k // 2 + 1)][k % 2]))
            else:
                a, b = map(int, prompt.rstrip("=").split("+"))
                out.append(Rollout(prompt, str(a + b) if k % N < SOLVED[prompt.rstrip("=")] else "0"))
        return out


def controller(scope="sampled", attempts=3, reward="learnable"):
    cfg = SelfPlayConfig(
        n_questions_per_prompt=2, max_repropose_attempts=attempts,
        proposer_train_scope=scope, weights={"completion": 1.0}, format_reward_coef=0.5, proposer_reward_coef=0.1,
        proposer_reward=reward,
    )  # fmt: skip
    engine = ScriptedEngine()
    return SelfPlayController(ArithmeticTask(), cfg, engine), engine


SEEDS = [{"input": "1+0="}, {"input": "2+0="}, {"input": "3+0="}]


def test_repropose_loop_reproposes_only_marked_prompts_and_stops_at_the_limit():
    ctl, engine = controller(attempts=3)
    batch = ctl.step(SEEDS, N, random.Random(0))
    proposer_calls = [c for c in engine.calls if c[0].startswith("[")]
    # round 1: all three prompts; round 2: the two marked ones; rounds 3-4: only the never-resolved one
    assert [sorted(set(c)) for c in proposer_calls] == [
        ["[1+0]>", "[2+0]>", "[3+0]>"],
        ["[2+0]>", "[3+0]>"],
        ["[3+0]>"],
        ["[3+0]>"],
    ]
    m = batch.metrics
    assert m["repropose/rounds"] == 4 and m["repropose/total_attempts"] == 1 + 2 + 4
    assert m["repropose/final_non_learnable"] == 1 and m["unified_filter/num_sampled"] == 2
    # questions: 6 + 4 + 2 + 2 = 14 proposed; learnable: 1+1 (round 1) and 5+5 (round 2)
    assert m["unified_filter/num_total"] == 14 and m["unified_filter/num_learnable"] == 2
    assert m["unified_filter/learnable_ratio"] == pytest.approx(2 / 14)
    assert m["selfplay/arithmetic/first_round_learnable_ratio"] == pytest.approx(1 / 6)
    assert m["selfplay/arithmetic/valid_ratio"] == pytest.approx(13 / 14)


def test_resolved_prompts_keep_their_data_and_rewards_follow_the_formulas():
    ctl, _ = controller(attempts=3)
    batch = ctl.step(SEEDS, N, random.Random(0))
    solver = [s for s in batch.samples if s.role == "solver"]
    proposer = [s for s in batch.samples if s.role == "proposer"]
    # prompt 1 kept its round-1 question 1+1, prompt 2 its round-2 question 5+5; prompt 3 has none
    assert [s.rollout.prompt for s in solver] == ["1+1="] * N + ["5+5="] * N
    right = [s.rollout.text for s in solver]
    assert right == ["2", "2", "0", "0", "10", "0", "0", "0"]
    # combined = completion + 0.5 * format (all digit answers) + 0.1 * proposer reward (1.0)
    expected = [(1.0 if t != "0" else 0.0) + 0.5 + 0.1 for t in right]
    assert [s.reward for s in solver] == pytest.approx(expected, abs=1e-12)
    assert [(s.rollout.prompt, s.rollout.text, s.reward) for s in proposer] == [
        ("[1+0]>", "1+1", 1.0),
        ("[2+0]>", "5+5", 1.0),
        ("[3+0]>", "9+9", -0.5),  # unresolved: the last group's first valid question carries -0.5
    ]
    assert batch.segments == [(0, N, N), (N, 2 * N, N), (2 * N, 2 * N + 3, 3)]
    assert batch.metrics["proposer/reward_mean"] == pytest.approx(0.5)
    assert batch.metrics["joint/proposer_solver_ratio"] == pytest.approx(3 / 8)


def test_group_scope_trains_every_question_of_the_final_groups():
    ctl, _ = controller(scope="group", attempts=3)
    batch = ctl.step(SEEDS, N, random.Random(0))
    proposer = [(s.rollout.text, s.reward) for s in batch.samples if s.role == "proposer"]
    assert proposer == [("1+1", 1.0), ("2+2", 0.0), ("5+5", 1.0), ("oops", -1.0), ("9+9", 0.0), ("8+8", 0.0)]
    assert batch.segments[-3:] == [(8, 10, 2), (10, 12, 2), (12, 14, 2)]


def test_difficulty_reward_grades_learnable_questions_by_how_rarely_the_solver_succeeds():
    """--proposer_reward difficulty (Absolute Zero's r_propose = 1 - solve rate): 1+1 (2 of 4 right) earns 0.5,
    5+5 (1 of 4) 0.75; questions that are not learnable, invalid or unresolved earn what they did before."""
    ctl, _ = controller(scope="group", reward="difficulty")
    batch = ctl.step(SEEDS, N, random.Random(0))
    proposer = [(s.rollout.text, s.reward) for s in batch.samples if s.role == "proposer"]
    assert proposer == [("1+1", 0.5), ("2+2", 0.0), ("5+5", 0.75), ("oops", -1.0), ("9+9", 0.0), ("8+8", 0.0)]
    ctl, _ = controller(scope="sampled", reward="difficulty")
    batch = ctl.step(SEEDS, N, random.Random(0))
    assert [s.reward for s in batch.samples if s.role == "proposer"] == [0.5, 0.75, -0.5]
    solver = [s.reward for s in batch.samples if s.role == "solver" and s.rollout.prompt == "1+1="]
    assert solver[0] == pytest.approx(1.0 + 0.5 + 0.1 * 0.5)  # right, well-formed, and its prompt's 0.5
    with pytest.raises(ValueError, match="proposer_reward must be one of"):
        controller(reward="hardest")


def test_no_reproposal_with_zero_attempts():
    ctl, engine = controller(attempts=0)
    batch = ctl.step(SEEDS, N, random.Random(0))
    assert sum(c[0].startswith("[") for c in engine.calls) == 1
    assert batch.metrics["repropose/final_non_learnable"] == 2
    assert [s.reward for s in batch.samples if s.role == "proposer"] == [1.0, -0.5, -0.5]


# ---------------------------------------------------------------------------------------------- joint batch


def test_advantages_are_computed_per_segment():
    """Solver groups of 4 and a proposer group of 3 in one batch: each segment's advantages are those of
    the estimator run on that segment alone (no whitening across roles)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("ray")
    from reinforce_pro.algos.advantages import AdvantageInputs, compute_advantages
    from reinforce_pro.algos.kl import build_kl_controller
    from reinforce_pro.experience import Samples
    from reinforce_pro.trainer.experience_builder import ExperienceBuilder, ExperienceConfig

    cfg = ExperienceConfig(advantage_estimator="reinforce_baseline", reward_clip_range=None)
    builder = ExperienceBuilder([], None, None, None, cfg, build_kl_controller(0.0, None, 1))
    gen = torch.Generator().manual_seed(0)
    b, t = 11, 5
    mask = torch.rand(b, t, generator=gen) > 0.2
    mask[:, 0] = True
    rewards = torch.randn(b, generator=gen, dtype=torch.float64).float()
    segments = [(0, 4, 4), (4, 8, 4), (8, 11, 3)]
    samples = Samples(
        torch.zeros(b, t + 2, dtype=torch.long), torch.ones(b, t + 2, dtype=torch.long), mask,
        torch.zeros(b, t), [""] * b, [""] * b, [None] * b, torch.zeros(b, dtype=torch.long),
        torch.zeros(b, dtype=torch.bool), advantage_segments=segments,
    )  # fmt: skip
    adv, ret = builder.advantages(samples, rewards, None, None)
    for start, end, g in segments:
        inp = AdvantageInputs(rewards=rewards[start:end], action_mask=mask[start:end], group_size=g)
        want_adv, want_ret = compute_advantages("reinforce_baseline", inp)
        torch.testing.assert_close(adv[start:end], want_adv.float(), rtol=0, atol=1e-6)
        torch.testing.assert_close(ret[start:end], want_ret.float(), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------- empty batches


def _scripted_source(proposals: list[str]):
    """A SelfPlaySource over a real Sampler (the built-in character tokenizer) whose engine is a script:
    proposer prompts get `proposals` in turn, solver prompts the answer "2"."""
    pytest.importorskip("ray")
    from reinforce_pro.models.tiny import build_tokenizer
    from reinforce_pro.rollout.sampler import RolloutConfig, Sampler
    from reinforce_pro.rollout.vllm_engine import Generation
    from reinforce_pro.selfplay.selfplay_source import SelfPlaySource

    class ScriptedSampler(Sampler):
        def sample(self, prompt_ids, sampling=None, engines=None):
            self.calls.append(len(prompt_ids))
            if not prompt_ids:
                return super().sample(prompt_ids, sampling, engines)  # the real empty path
            texts = [proposals[i % len(proposals)] if self.decode_prompt(p).startswith("[") else "2"
                     for i, p in enumerate(prompt_ids)]  # fmt: skip
            return [
                Generation(self.tokenizer.encode(t, add_special_tokens=False), [0.0] * len(t), "stop") for t in texts
            ]

        def decode_prompt(self, ids):
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    sampler = ScriptedSampler([object()], build_tokenizer(), RolloutConfig())
    sampler.calls = []  # prompts per sample() call
    cfg = SelfPlayConfig(n_questions_per_prompt=2, max_repropose_attempts=2,
                         weights={"completion": 1.0})  # fmt: skip
    return SelfPlaySource(sampler, ArithmeticTask(), cfg, seed=0), sampler


def test_a_round_with_no_valid_proposal_asks_for_nothing_and_gets_nothing():
    """The README's --absolute_zero run crashed at step 143 when every proposal of a round was
    invalid: no solver prompt, and the tokenizer decoded the empty batch to one empty text."""
    source, sampler = _scripted_source(["oops", "nope"])
    assert source.sampler.decode([]) == [] and source.generate_texts([]) == []
    batch = source.controller.step([{"input": "1+0="}, {"input": "2+0="}], N, random.Random(0))
    assert sampler.calls == [0, 4, 0, 4, 0, 4, 0]  # generate_texts([]), then 3 rounds with no solver prompt
    assert batch.metrics["selfplay/arithmetic/valid_ratio"] == 0.0
    assert batch.metrics["repropose/final_non_learnable"] == 2
    assert [s.role for s in batch.samples] == ["proposer", "proposer"]
    assert [s.reward for s in batch.samples] == [-0.5, -0.5]


def test_proposer_completions_and_solver_episodes_carry_their_engine_routes():
    """MoE engines: a completion's routes (what its call fed) and an agent episode's (agents/episode.py) go into
    the padded rows under their tokens, -1 on padding; with no routes captured none travel."""
    torch = pytest.importorskip("torch")
    from reinforce_pro.agents.episode import Episode
    from reinforce_pro.rollout.vllm_engine import Generation

    source, _ = _scripted_source(["1+1"])
    completion = Generation([7, 8, 9], [-0.1] * 3, "stop", torch.full((4, 2, 1), 3, dtype=torch.int16))
    episode = Episode(1, 1, "q", None, [4, 5, 6])
    episode.add_model([10, 11], [-0.2, -0.3], "", routes=torch.full((4, 2, 1), 5, dtype=torch.int16))
    episode.add_environment([12], "")
    rows = [Rollout("p", "", ([1, 2], completion)), Rollout("q", "", episode)]
    samples = source.to_samples(rows, torch.tensor([0, 1]))
    real = samples.attention_mask.bool()
    assert samples.routes.shape == (2, samples.sequences.size(1), 2, 1) and (samples.routes[~real] == -1).all()
    assert samples.routes[0][real[0]][:, 0, 0].tolist() == [3, 3, 3, 3, -1]  # prompt 2 + 3 sampled, last never fed
    assert samples.routes[1][real[1]][:, 0, 0].tolist() == [5, 5, 5, 5, -1, -1]  # the tool's token: fed by no call
    plain = Generation([7], [-0.1], "stop")
    assert source.to_samples([Rollout("p", "", ([1, 2], plain))], torch.tensor([0])).routes is None


def test_every_rollout_source_keeps_the_trainers_contract():
    """The trainer sees a source only through RolloutSource (rollout/sampler.py)."""
    pytest.importorskip("ray")
    from reinforce_pro.agents.agent_source import AgentSource
    from reinforce_pro.agents.runner import AgentConfig
    from reinforce_pro.rollout.sampler import PartialRollout, PromptSource, RolloutSource

    source, sampler = _scripted_source(["1+1"])

    class Agent:
        async def reset(self, states, **kwargs):
            return {"observation": states["observation"]}

        async def step(self, states, **kwargs):
            return {"rewards": 0.0, "done": True}

    partial = PartialRollout(2, lambda chunk: 0)
    for src in (PromptSource(sampler), source, AgentSource(sampler, Agent, AgentConfig())):
        assert isinstance(src, RolloutSource), type(src).__name__
        assert src.sampler is sampler
        src.load_state_dict(src.state_dict())
    for src in (PromptSource(sampler), AgentSource(sampler, Agent, AgentConfig())):
        src.use_partial(partial)
        assert src.partial is partial
    with pytest.raises(ValueError, match="--partial_rollout applies to prompt rollouts"):
        source.use_partial(partial)


def test_curriculum_metrics_describe_the_proposals():
    """Difficulty of proposed and learnable questions, and the proposals' diversity, over every
    round of a step (the scripted run of the repropose test: 13 valid proposals, 7 distinct)."""
    import math

    ctl, _ = controller(attempts=3)
    m = ctl.step(SEEDS, N, random.Random(0)).metrics
    counts = [1, 1, 1, 1, 1, 4, 4]  # 1+1 2+2 3+3 4+4 5+5 once, 9+9 and 8+8 four times
    assert m["selfplay/arithmetic/proposal_unique_frac"] == pytest.approx(7 / 13)
    assert m["selfplay/arithmetic/proposal_entropy"] == pytest.approx(-sum(c / 13 * math.log2(c / 13) for c in counts))
    assert m["selfplay/arithmetic/proposed_digits_mean"] == 1.0
    assert m["selfplay/arithmetic/proposed_answer_digits_mean"] == pytest.approx(22 / 13)
    assert m["selfplay/arithmetic/learnable_answer_digits_mean"] == pytest.approx(1.5)  # 1+1 and 5+5


# ---------------------------------------------------------------------------------------------- references


def test_reference_buffer_feeds_learnable_questions_back_as_proposer_prompts():
    """The remedy for a proposer collapsing near its seeds (Absolute Zero's reference examples): with
    reference_buffer N, proposer prompts show one of the last N learnable questions; the buffer is part of
    the source's resume state."""
    calls = []

    def generate(prompts, sampling=None):
        calls.append(prompts)
        out = []
        for k, prompt in enumerate(prompts):
            if prompt.startswith("["):  # propose the reference with its first operand + 1
                a, b = prompt[1:-2].split("+")
                out.append(Rollout(prompt, f"{int(a) + 1}+{b}"))
            else:  # half of the solver's responses right: every question is learnable
                a, b = prompt.rstrip("=").split("+")
                out.append(Rollout(prompt, str(int(a) + int(b)) if k % 2 else "x"))
        return out

    cfg = SelfPlayConfig(n_questions_per_prompt=2, weights={"completion": 1.0},
                         reference_buffer=3)  # fmt: skip
    ctl = SelfPlayController(ArithmeticTask(), cfg, generate)
    rng = random.Random(0)
    first = ctl.step([{"input": "1+0="}, {"input": "5+0="}], N, rng)
    assert calls[0] == ["[1+0]>"] * 2 + ["[5+0]>"] * 2 and first.metrics["proposer/reference_frac"] == 0.0
    assert [q.text for q in ctl.references] == ["2+0", "6+0", "6+0"]  # the last 3 learnable of the last round
    before = len(calls)
    second = ctl.step([{"input": "1+0="}, {"input": "5+0="}], N, rng)
    assert set(calls[before]) <= {"[2+0]>", "[6+0]>"} and second.metrics["proposer/reference_frac"] == 1.0
    assert second.metrics["proposer/reference_buffer_size"] == 3.0
    restored = SelfPlayController(ArithmeticTask(), cfg, generate)
    restored.load_state_dict(ctl.state_dict())
    assert list(restored.references) == list(ctl.references)
    off = SelfPlayController(ArithmeticTask(), replace(cfg, reference_buffer=0), generate)
    off.step([{"input": "1+0="}], N, rng)
    off.step([{"input": "1+0="}], N, rng)
    assert calls[-2][0] == "[1+0]>" and not off.references  # 0: always the seeds


def test_ladder_eval_scores_greedy_answers_per_level():
    pytest.importorskip("ray")
    from reinforce_pro.rollout.sampler import RolloutConfig
    from reinforce_pro.selfplay.builtin_tasks import evaluate_expression
    from reinforce_pro.selfplay.ladder import LadderEval

    task = ArithmeticTask()
    levels = {name: qs[:5] for name, qs in task.ladder().items() if name in ("add_0-19", "sub_0-9", "mul_0-9")}

    class Sampler:
        cfg = RolloutConfig(temperature=1.0)

        def sample_texts(self, prompts, sampling):
            self.sampling = sampling  # right on additions, wrong elsewhere
            texts = [str(evaluate_expression(p[:-1])) if "+" in p else "1000" for p in prompts]
            return [[0]] * len(prompts), [None] * len(prompts), texts

    sampler = Sampler()
    metrics = LadderEval(task, levels).run(sampler)
    assert sampler.sampling["temperature"] == 0.0
    assert metrics == {
        "eval/ladder/add_0-19/accuracy": 1.0, "eval/ladder/sub_0-9/accuracy": 0.0,
        "eval/ladder/mul_0-9/accuracy": 0.0, "eval/ladder/accuracy_mean": pytest.approx(1 / 3),
    }  # fmt: skip
    assert LadderEval(task, levels).metric_names() == list(metrics)


def test_a_roles_sampling_overrides_the_runs_under_its_token_ceiling():
    """SelfPlayTask.sampling gives each role its own budget (code_output: a program vs a one-line answer);
    --max_new_tokens stays the ceiling so a response always fits --max_len (the tiny model's 64)."""
    run = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 20}
    assert role_sampling(run, {"max_tokens": 128, "stop": ["\n\n"]}) == {**run, "stop": ["\n\n"]}
    assert role_sampling(run, {"max_tokens": 8, "temperature": 0.0}) == {
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 8,
    }
    assert role_sampling(run, None) == run
