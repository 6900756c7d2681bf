"""--prompt_data a,b --prompt_data_probs p,q: several prompt datasets mixed by share (data/prompts.py)."""

import json
from collections import Counter

import pytest

from reinforce_pro.cli.train_ppo_ray import parse_args
from reinforce_pro.data.prompts import DataError, load_prompt_records, mix, parse_mixture


def test_parse_mixture_normalises_and_defaults_to_equal_shares():
    assert parse_mixture("a.jsonl, b.jsonl", "3,1") == [("a.jsonl", 0.75), ("b.jsonl", 0.25)]
    assert parse_mixture("a.jsonl,b.jsonl", None) == [("a.jsonl", 0.5), ("b.jsonl", 0.5)]
    for probs, message in [("1", "1 probabilities for 2 datasets"), ("1,x", "comma-separated numbers"),
                           ("1,0", "must be > 0"), ("1,nan", "must be > 0"), ("1,inf", "must be > 0")]:  # fmt: skip
        with pytest.raises(DataError, match=message):
            parse_mixture("a.jsonl,b.jsonl", probs)


def test_mix_follows_the_shares_never_repeats_and_is_seeded():
    a = [{"src": "a", "i": i} for i in range(1000)]
    b = [{"src": "b", "i": i} for i in range(1000)]
    out = mix([a, b], [0.8, 0.2], 500, seed=3)
    counts = Counter(r["src"] for r in out)
    assert len(out) == 500 and 360 <= counts["a"] <= 440  # 400 expected; binomial sd ~9
    for src in "ab":  # each dataset's records in order, none twice
        idx = [r["i"] for r in out if r["src"] == src]
        assert idx == list(range(len(idx)))
    assert mix([a, b], [0.8, 0.2], 500, seed=3) == out and mix([a, b], [0.8, 0.2], 500, seed=4) != out
    # a dataset that runs out leaves the draw: everything is used once, nothing more
    small = mix([a[:10], b[:5]], [0.5, 0.5], 100, seed=0)
    assert len(small) == 15 and Counter(r["src"] for r in small) == {"a": 10, "b": 5}


def test_load_prompt_records_mixes_files(tmp_path):
    for name in ("math", "code"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"input": f"{name} {i}"}) + "\n" for i in range(50)))
    paths = f"{tmp_path / 'math.jsonl'},{tmp_path / 'code.jsonl'}"
    records = load_prompt_records(paths, "1,1", "train", max_samples=60, seed=0)
    sources = Counter(r["input"].split()[0] for r in records)
    assert len(records) == 60 and sources["math"] + sources["code"] == 60 and min(sources.values()) >= 10
    assert load_prompt_records(str(tmp_path / "math.jsonl"), None, "train", 7, 0) == [
        {"input": f"math {i}"} for i in range(7)
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompt_data_probs", "0.5,0.5"], "--prompt_data_probs mixes the datasets of --prompt_data"),
        (
            ["--prompt_data", "a.jsonl,b.jsonl", "--remote_rm_url", "r.py", "--prompt_data_probs", "1"],
            "1 probabilities for 2 datasets",
        ),
    ],
)
def test_bad_mixture_flags_stop_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_mixture_parses():
    args = parse_args(["--prompt_data", "a.jsonl,b.jsonl", "--remote_rm_url", "r.py", "--data.prompt_probs", "0.7,0.3"])
    assert args.prompt_data_probs == "0.7,0.3"
