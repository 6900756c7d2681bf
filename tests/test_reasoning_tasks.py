"""data/reasoning_tasks.py and examples/python/reward_reasoning_gym.py: reasoning-gym's generators as prompt
files, its verifiers as the reward (the `models` extra)."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")
torch = pytest.importorskip("torch")

from reinforce_pro.data.reasoning_tasks import ANSWER_HINT, main, task_records, write_task  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "python"))
from reward_reasoning_gym import extract_answer, reward_func  # noqa: E402


@pytest.mark.parametrize("task", ["basic_arithmetic", "chain_sum", "products", "gsm_symbolic"])
def test_records_are_deterministic_and_the_verifier_accepts_their_answers(task):
    records = task_records(task, 6, seed=3)
    assert records == task_records(task, 6, seed=3) and records != task_records(task, 6, seed=4)
    assert all(
        r["question"].endswith(ANSWER_HINT) and r["entry"]["metadata"]["source_dataset"] == task for r in records
    )
    prompts = [r["question"] for r in records]
    right = [f" So the result is {r['answer']}." for r in records]
    wrong = [" I do not know.", " 1 + 1 = 2, so 999999."] + [" 424242."] * 4
    good = reward_func([p + a for p, a in zip(prompts, right, strict=True)], prompts, [r["entry"] for r in records])
    bad = reward_func([p + a for p, a in zip(prompts, wrong, strict=True)], prompts, [r["entry"] for r in records])
    assert good["rewards"].tolist() == [1.0] * 6
    assert all(r <= 0.01 for r in bad["rewards"].tolist())  # gsm_symbolic gives 0.01 to any wrong number
    assert bad["extra_logs"]["answered"].tolist() == [0.0] + [1.0] * 5


def test_the_last_number_is_the_answer():
    assert extract_answer("3 + 4 = 7") == "7"
    assert extract_answer("it is -12.5 or 1,234") == "1234"
    assert extract_answer("no digits") is None


def test_train_and_held_out_files_do_not_share_questions(tmp_path):
    """reasoning-gym draws item i from Random(seed + i): seed + 1 would be the training items shifted by one.
    On a task of 200 distinct questions, 300 training records without any of the 40 held-out ones."""
    train, held_out = write_task("chain_sum", tmp_path, 300, 40, seed=0, config={"max_terms": 2, "max_digits": 1})
    questions = [json.loads(line)["question"] for line in train.read_text().splitlines()]
    held = [json.loads(line)["question"] for line in held_out.read_text().splitlines()]
    assert len(questions) == 300 and len(held) == 40 == len(set(held))
    assert not set(held) & set(questions)
    assert all(q.count("+") + q.count("-") == 1 for q in questions + held)  # two terms, as set


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["no_such_task"], "unknown task 'no_such_task'", id="task"),
        pytest.param(["chain_sum", "--set", "max_terms"], "--set takes KEY=VALUE", id="set-form"),
        pytest.param(["chain_sum", "--set", "bogus=1"], "unexpected keyword argument 'bogus'", id="set-key"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, capsys, argv, message):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("reasoning_tasks: error: ") and message in err
