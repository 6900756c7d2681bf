"""The running-sum task (data/running_sum.py): its worked responses, its disjoint splits, its verifier on hostile
outputs, and how --builtin_task running_sum reaches a run."""

import statistics

import pytest

from reinforce_pro.data import EMBEDDED_TASKS, embedded_reward
from reinforce_pro.data import running_sum as rs


@pytest.mark.parametrize(
    "digits, expected",
    [
        pytest.param(
            [7, 1, 0, 1, 9, 0, 1, 1, 5, 3], "a7=7;b1=8;c0=8;d1=9;e9=18;f0=18;g1=19;h1=20;i5=25;j3=28;#28", id="mixed"
        ),  # fmt: skip
        pytest.param([0] * 10, "a0=0;b0=0;c0=0;d0=0;e0=0;f0=0;g0=0;h0=0;i0=0;j0=0;#0", id="zeros"),
        pytest.param([9] * 10, "a9=9;b9=18;c9=27;d9=36;e9=45;f9=54;g9=63;h9=72;i9=81;j9=90;#90", id="nines"),
    ],
)
def test_the_worked_response_is_the_running_sum(digits, expected):
    assert rs.prompt(digits) == "".join(f"{letter}{d}" for letter, d in zip("abcdefghij", digits, strict=True)) + "="
    assert rs.worked(digits) == expected
    assert rs.reward(expected, str(sum(digits))) == 1.0
    with pytest.raises(ValueError):
        rs.prompt(digits[:9])  # ten terms, one per letter


def test_splits_are_disjoint_by_rule_and_responses_are_long():
    train = [r for seed in range(3) for r in rs.records(3000, seed)]
    held = [r for seed in range(3) for r in rs.records(1000, seed, split="held_out")]
    assert not {r["input"] for r in train} & {r["input"] for r in held}
    digits = lambda r: [int(c) for c in r["input"][1:-1:2]]  # noqa: E731
    assert all(rs.held_out(digits(r)) for r in held) and not any(rs.held_out(digits(r)) for r in train)
    assert len({r["label"] for r in held}) > 20  # the held-out totals are not one residue class
    # one token per character on the tiny model's tokenizer, +1 for <eos>
    assert statistics.mean(len(r["solution"]) + 1 for r in train) >= 48
    assert max(len(r["solution"]) + 1 for r in train) <= 64  # the preset's new-token budget
    with pytest.raises(ValueError, match="split must be train or held_out"):
        rs.records(1, 0, split="test")


@pytest.mark.parametrize(
    "response, reward",
    [
        pytest.param("", 0.0, id="empty"),
        pytest.param("28", 0.0, id="no-marker"),
        pytest.param("j3=28;", 0.0, id="steps-without-answer"),
        pytest.param("#28;", 0.0, id="trailing-junk"),
        pytest.param("#2 8", 0.0, id="space-inside"),
        pytest.param("#\uff12\uff18", 0.0, id="fullwidth-digits"),
        pytest.param("#2\u00b2", 0.0, id="superscript"),
        pytest.param("#-28", 0.0, id="sign"),
        pytest.param("#28\n", 1.0, id="trailing-newline"),
        pytest.param("a1=1;#3;#28", 1.0, id="last-marker-counts"),
        pytest.param("#28;#3", 0.0, id="a-later-wrong-answer"),
        pytest.param("#0028", 1.0, id="leading-zeros"),
        pytest.param("a1=1;" * 60 + "#28", 0.0, id="over-long"),
        pytest.param(None, 0.0, id="not-a-string"),
    ],
)
def test_the_verifier_on_hostile_outputs(response, reward):
    assert rs.reward(response, "28") == reward


def test_embedded_reward_scores_the_response_after_the_prompt():
    reward = embedded_reward("running_sum")
    digits = [7, 1, 0, 1, 9, 0, 1, 1, 5, 3]
    prompt = rs.prompt(digits)
    out = reward([prompt + rs.worked(digits), prompt + "a7=7;#27"], [prompt, prompt], ["28", "28"])
    assert out["rewards"].tolist() == [1.0, 0.0]
    task = EMBEDDED_TASKS["running_sum"]()
    assert [e["label"] for e in task.warm_start(3, 5)] == [r["solution"] for r in rs.records(3, 5)]
    assert task.model_layers == 2


def test_builtin_task_reaches_the_run_and_its_preset():
    from reinforce_pro.cli.presets import RUNNING_SUM_WARMUP
    from reinforce_pro.cli.train_ppo_ray import parse

    args, cfg = parse(["--builtin_task", "running_sum"])
    assert args.preset == "embedded-running-sum" and cfg.data.builtin_task == "running_sum"
    assert cfg.rollout.max_new_tokens == 64 and cfg.models.sft_warmup_steps == RUNNING_SUM_WARMUP["sft_warmup_steps"]
    assert cfg.models.sft_warmup_target == RUNNING_SUM_WARMUP["sft_warmup_target"] > 0
    args, cfg = parse(["--builtin_task", "running_sum", "--sft_warmup_steps", "5"])
    assert cfg.models.sft_warmup_steps == 5  # a flag wins over its preset value


def test_greedy_accuracy_prompts_as_the_warm_start_trains_and_scores_each_answer():
    import torch

    from reinforce_pro.models.tiny import build_tokenizer
    from reinforce_pro.trainer.sft_warmup import greedy_accuracy

    tok = build_tokenizer()
    records = [{"input": "a1=", "label": "1"}, {"input": "a10=", "label": "10"}]
    seen = {}

    class Answers:  # answers "#1" to every prompt; records what it was asked and in which mode
        def eval(self):
            seen["mode"] = "eval"

        def train(self):
            seen["after"] = "train"

        def generate(self, input_ids, attention_mask, **kw):
            seen.update(ids=input_ids.tolist(), mask=attention_mask.tolist(), greedy=not kw["do_sample"])
            answer = torch.tensor([tok("#1", add_special_tokens=False)["input_ids"]] * len(input_ids))
            return torch.cat([input_ids, answer], dim=1)

    assert greedy_accuracy(Answers(), tok, records, rs.reward, max_new_tokens=8) == 0.5
    first, second = (tok(r["input"], add_special_tokens=False)["input_ids"] for r in records)
    assert seen["ids"] == [[tok.pad_token_id, tok.bos_token_id, *first], [tok.bos_token_id, *second]]
    assert seen["mask"] == [[0] + [1] * (len(first) + 1), [1] * (len(second) + 1)]
    assert seen["greedy"] and (seen["mode"], seen["after"]) == ("eval", "train")


def test_a_warm_start_stops_at_the_first_check_its_stop_condition_holds(tmp_path):
    from reinforce_pro.models.tiny import build_tiny_model
    from reinforce_pro.trainer.sft_warmup import CHECK_EVERY, sft_warm_start

    base = build_tiny_model(tmp_path / "tiny")
    examples = EMBEDDED_TASKS["running_sum"]().warm_start(64, 0)
    checks = []
    stats = sft_warm_start(base, tmp_path / "out", examples, steps=3 * CHECK_EVERY, batch_size=4,
                           stop=lambda model, tok: checks.append(1) or len(checks) == 2)  # fmt: skip
    assert stats["sft/steps"] == 2 * CHECK_EVERY and len(checks) == 2
    assert (tmp_path / "out" / "config.json").exists()


def test_the_command_line_prints_a_split_as_jsonl(capsys):
    import json

    from reinforce_pro.data.splits import print_split

    print_split(rs.records, ["--n", "3", "--split", "held_out", "--seed", "7"])
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == rs.records(3, 7, "held_out")
