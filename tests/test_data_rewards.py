"""Prompt data loading and the reward-file contract (OpenRLHF's reward_func(queries, prompts, labels))."""

import json

import pytest
import torch

from reinforce_pro.data.arithmetic import arithmetic_records
from reinforce_pro.data.prompts import DataError, PromptConfig, build_prompts, load_records
from reinforce_pro.rewards.builtin import exact_match_reward
from reinforce_pro.rewards.loader import RewardFileError, load_reward_func, normalize_reward_output


def test_jsonl_error_names_file_and_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"input": "a"}\n\n{"input": "b"}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"p.jsonl:4: expected a JSON object, got list"):
        load_records(f)
    f.write_text('{"input": "a"}\n{"input": \n')
    with pytest.raises(DataError, match=r"p.jsonl:2: not valid JSON"):
        load_records(f)


def test_directory_of_jsonl_and_missing_path(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    (tmp_path / "test.jsonl").write_text('{"input": "c"}\n')
    assert [r["input"] for r in load_records(tmp_path, "train")] == ["a", "b"]
    assert [r["input"] for r in load_records(tmp_path, "test")] == ["c"]
    with pytest.raises(DataError, match="no such file or directory"):
        load_records(tmp_path / "missing")


def test_hf_save_to_disk_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"q": "1+1=", "a": "2"}])})
    ds.save_to_disk(str(tmp_path / "ds"))
    assert load_records(tmp_path / "ds", "train") == [{"q": "1+1=", "a": "2"}]
    with pytest.raises(DataError, match="no split 'eval'"):
        load_records(tmp_path / "ds", "eval")


def test_build_prompts_template_label_and_errors():
    records = [{"q": "1+1=", "a": 2}]
    out = build_prompts(records, PromptConfig("q", "a", "Question: {} Answer:"))
    assert out == [{"prompt": "Question: 1+1= Answer:", "label": 2}]
    with pytest.raises(DataError, match="record 0 has no input key 'input'"):
        build_prompts(records, PromptConfig())
    with pytest.raises(DataError, match="no label key 'label'"):
        build_prompts(records, PromptConfig("q", "label"))


def test_chat_template_with_the_built_in_tokenizer():
    pytest.importorskip("transformers")
    from reinforce_pro.models.tiny import build_tokenizer

    out = build_prompts([{"input": "3+4="}], PromptConfig(apply_chat_template=True), build_tokenizer())
    assert out[0]["prompt"] == "<bos>user: 3+4=\nassistant: "


def test_arithmetic_records_are_seeded_and_correct():
    a, b = arithmetic_records(50, seed=3), arithmetic_records(50, seed=3)
    assert a == b and a != arithmetic_records(50, seed=4)
    for r in a:
        x, y = r["input"].rstrip("=").split("+")
        assert int(x) + int(y) == int(r["label"])


def test_exact_match_reward():
    out = exact_match_reward(["1+1= 2", "1+1=3", "2+2=4 "], ["1+1=", "1+1=", "2+2="], ["2", "2", "4"])
    assert out["rewards"].tolist() == [1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "value, rewards, scores, extra",
    [
        pytest.param(torch.tensor([1.0, 0.0]), [1.0, 0.0], [1.0, 0.0], {}, id="tensor"),
        pytest.param([0.5, 2], [0.5, 2.0], [0.5, 2.0], {}, id="list"),
        pytest.param(
            {"rewards": [1, 0], "scores": [0.9, 0.1], "extra_logs": {"len": [3, 4]}},
            [1.0, 0.0], [0.9, 0.1], {"len": [3.0, 4.0]}, id="dict",
        ),
        pytest.param({"rewards": [1, 0]}, [1.0, 0.0], [1.0, 0.0], {}, id="dict-rewards-only"),
    ],
)  # fmt: skip
def test_reward_output_forms(value, rewards, scores, extra):
    out = normalize_reward_output(value, 2)
    assert out.rewards.tolist() == rewards
    assert out.scores.tolist() == pytest.approx(scores)
    assert {k: v.tolist() for k, v in out.extra_logs.items()} == extra


@pytest.mark.parametrize(
    "value, match",
    [
        pytest.param([1.0], "returned 1 rewards for 2 queries", id="length"),
        pytest.param([1.0, float("nan")], r"non-finite rewards at 1 of 2 queries: \[1\]=nan$", id="nan"),
        pytest.param({"rewards": [1.0, 2.0], "scores": [float("inf")] * 2}, "scores at 2 of 2", id="inf-scores"),
        pytest.param(["good", "bad"], r"rewards that are not numbers \(\['good', 'bad'\]", id="strings"),
        pytest.param(None, "rewards that are not numbers", id="none"),
        pytest.param({"scores": [1, 2]}, "without 'rewards'", id="no-rewards"),
    ],
)
def test_reward_output_errors(value, match):
    with pytest.raises(RewardFileError, match=match):
        normalize_reward_output(value, 2)


def test_non_finite_extra_logs_are_dropped_not_fatal(capsys):
    out = normalize_reward_output({"rewards": [1, 0], "extra_logs": {"len": [1, 2], "ratio": [0.5, float("nan")]}}, 2)
    assert out.rewards.tolist() == [1.0, 0.0] and list(out.extra_logs) == ["len"]
    assert "extra_logs['ratio'] has non-finite values" in capsys.readouterr().out


def test_reward_file_loading(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("import torch\ndef reward_func(queries, prompts, labels):\n    return torch.ones(len(queries))\n")
    assert load_reward_func(good)(["a", "b"], ["", ""], [None, None]).tolist() == [1.0, 1.0]
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_xyz\n")
    with pytest.raises(RewardFileError, match="broken.py: importing it failed: ModuleNotFoundError"):
        load_reward_func(broken)
    with pytest.raises(RewardFileError, match="not an existing .py file"):
        load_reward_func(tmp_path / "missing.py")
    json_file = tmp_path / "x.json"
    json_file.write_text(json.dumps({}))
    with pytest.raises(RewardFileError, match="not an existing .py file"):
        load_reward_func(json_file)


@pytest.mark.parametrize("policy", ["zero", "drop"])
def test_reward_nan_policy_replaces_non_finite_rewards_and_marks_their_rows(policy):
    out = normalize_reward_output({"rewards": [1.0, float("nan"), 2.0], "scores": [0.5, 0.5, float("inf")]}, 3, policy)
    assert out.rewards.tolist() == [1.0, 0.0, 0.0] and out.scores.tolist() == [0.5, 0.0, 0.0]
    assert out.extra_logs["nonfinite"].tolist() == [0.0, 1.0, 1.0]
    plain = normalize_reward_output([1.0, 2.0], 2, policy)
    assert plain.extra_logs["nonfinite"].tolist() == [0.0, 0.0]  # logged every step, 0 when all is well
    with pytest.raises(RewardFileError, match="not numbers"):
        normalize_reward_output(["a", "b"], 2, policy)  # only non-finite numbers are forgiven
