"""The long-response embedded task (data/scratchpad.py): its worked solutions, its disjoint splits, its verifier
on hostile outputs, and how --builtin_task scratchpad reaches a run."""

import statistics

import pytest

from reinforce_pro.data import EMBEDDED_TASKS, embedded_reward
from reinforce_pro.data import scratchpad as sp


@pytest.mark.parametrize(
    "a, b, expected",
    [
        pytest.param(4831, 2907, "1+7+0=8,8;3+0+0=3,38;8+9+0=17,738;4+2+1=7,7738;#7738", id="one-carry"),
        pytest.param(9999, 9999, "9+9+0=18,8;9+9+1=19,98;9+9+1=19,998;9+9+1=19,19998;#19998", id="all-carries"),
        pytest.param(0, 0, "0+0+0=0,0;0+0+0=0,00;0+0+0=0,000;0+0+0=0,0000;#0", id="zeros"),
    ],
)
def test_the_worked_solution_is_the_column_addition(a, b, expected):
    assert sp.prompt(a, b) == f"{a:04d}+{b:04d}="
    assert sp.scratchpad(a, b) == expected
    assert sp.reward(expected, str(a + b)) == 1.0


def test_splits_are_disjoint_and_responses_are_long():
    train = {r["input"] for seed in range(3) for r in sp.records(2000, seed)}
    held = {r["input"] for seed in range(3) for r in sp.records(2000, seed, split="held_out")}
    assert not train & held and len(held) > 5000
    # the tiny model's tokenizer has one token per character; +1 for <eos>
    assert statistics.mean(len(r["solution"]) + 1 for r in sp.records(2000, 0)) >= 48
    with pytest.raises(ValueError, match="split must be train or held_out"):
        sp.records(1, 0, split="test")


@pytest.mark.parametrize(
    "response, reward",
    [
        pytest.param("", 0.0, id="empty"),
        pytest.param("7738", 0.0, id="no-marker"),
        pytest.param("#", 0.0, id="marker-only"),
        pytest.param("#7738x", 0.0, id="trailing-junk"),
        pytest.param("#77 38", 0.0, id="space-inside"),
        pytest.param("#\uff17\uff17\uff13\uff18", 0.0, id="fullwidth-digits"),
        pytest.param("#773\u00b2", 0.0, id="superscript"),
        pytest.param("#7738\n", 1.0, id="trailing-newline"),
        pytest.param("#1;#7738", 1.0, id="last-marker-counts"),
        pytest.param("#7738;#1", 0.0, id="a-later-wrong-answer"),
        pytest.param("#007738", 1.0, id="leading-zeros"),
        pytest.param("x" * 300 + "#7738", 0.0, id="over-long"),
        pytest.param("<information>#7738</information>", 0.0, id="tags"),
    ],
)
def test_the_verifier_on_hostile_outputs(response, reward):
    assert sp.reward(response, "7738") == reward


def test_embedded_reward_scores_the_response_after_the_prompt():
    reward = embedded_reward("scratchpad")
    prompt = sp.prompt(4831, 2907)
    out = reward([prompt + sp.scratchpad(4831, 2907), prompt + "#7737", "#7738"], [prompt, prompt, prompt],
                 ["7738", "7738", "7738"])  # fmt: skip
    assert out["rewards"].tolist() == [1.0, 0.0, 1.0]  # a query without its prompt is scored whole
    examples = EMBEDDED_TASKS["scratchpad"]().warm_start(4, 0)
    assert all(e["label"].startswith(e["label"][:1]) and "#" in e["label"] for e in examples)


def test_builtin_task_reaches_the_run_and_its_preset(capsys):
    from reinforce_pro.cli.train_ppo_ray import parse

    args, cfg = parse(["--builtin_task", "scratchpad"])
    assert args.preset == "embedded-scratchpad" and cfg.data.builtin_task == "scratchpad"
    assert cfg.rollout.max_new_tokens == 64 and cfg.models.sft_warmup_steps == 1200
    _, plain = parse([])
    assert plain.data.builtin_task == "arithmetic" and plain.rollout.max_new_tokens == 6
    with pytest.raises(SystemExit):
        parse(
            ["--builtin_task", "scratchpad", "--prompt_data", "p.jsonl", "--pretrain", "m", "--remote_rm_url", "r.py"]
        )
    assert "give it without --prompt_data" in capsys.readouterr().err


def test_prepare_builds_the_scratchpad_prompts_and_reward(tmp_path):
    from reinforce_pro.cli.train_ppo_ray import parse
    from reinforce_pro.run.prepare import prepare

    _, cfg = parse(["--builtin_task", "scratchpad", "--sft_warmup_steps", "2", "--max_samples", "64",
                    "--save_path", str(tmp_path / "run")])  # fmt: skip
    plan = prepare(cfg)
    assert plan.reward_source == "builtin:scratchpad"
    first = plan.prompts[0]
    assert first["prompt"].endswith("=") and "+" in first["prompt"] and len(first["label"]) >= 1
