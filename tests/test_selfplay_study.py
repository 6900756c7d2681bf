"""The self-play study's analysis (studies/selfplay_study.py) on constructed runs: the issue's criteria
per seed, the ladder's paired gains, the arm comparison and the rendered page."""

from __future__ import annotations

import json

import pytest

from studies import selfplay_study as study


def _run(arm: str, seed: int, ratio: list[float], ladder_end: float, unique: float = 0.5) -> dict:
    n = len(ratio)
    series = {name: [0.5] * n for name in study.SERIES}
    series["learnable"], series["unique"] = ratio, [unique] * n
    ladder = {level: [[0, 0.1], [n, 0.1]] for level in study.LADDER_LEVELS}
    ladder["add_20-29"] = [[0, 0.0], [n // 2, 0.1], [n, ladder_end]]
    return {"arm": arm, "seed": seed, "steps": n, "wall_s": 1.0, "series": series, "ladder": ladder}


def test_summary_reads_the_issues_criteria_off_a_run():
    ratio = [0.5] * 30 + [0.1] * 25 + [0.6] * 35  # 90 steps: thirds of 30
    s = study.summarise(_run("default", 1, ratio, 0.3))
    assert s["thirds"] == pytest.approx([0.5, (0.1 * 25 + 0.6 * 5) / 30, 0.6])
    assert s["last_third"] == pytest.approx(0.6)
    assert s["low_stretch"] == 25  # 25 consecutive steps below 0.2: fails "no more than 20"
    assert s["ladder_first"]["add_20-29"] == 0.0 and s["ladder_last"]["add_20-29"] == 0.3


def test_ladder_gains_are_paired_over_seeds():
    runs = [_run("default", seed, [0.5] * 9, end) for seed, end in ((1, 0.2), (2, 0.3), (3, 0.4))]
    rows = {row["level"]: row for row in study.ladder_gains(runs)}
    assert list(rows) == list(study.LADDER_LEVELS)  # the task's order, easy to hard
    assert rows["add_20-29"]["gain"] == pytest.approx(0.3) and 0.2 <= rows["add_20-29"]["low"] <= 0.3
    assert rows["add_0-19"]["gain"] == 0.0


def test_render_writes_tables_plots_and_the_arm_comparison(tmp_path):
    pytest.importorskip("matplotlib")
    runs = [_run("default", s, [0.6] * 9, 0.3, unique=0.6) for s in (1, 2)]
    runs += [_run("no-repetition-penalty", s, [0.3] * 9, 0.1, unique=0.2) for s in (1, 2)]
    runs[0]["commit"] = runs[1]["commit"] = "6be61ef1234567-dirty"  # an arm may be run at another commit
    payload = {"commit": "abc123def4567", "config": {"warm_start_levels": ["add_0-19"]}, "results": {"runs": runs}}
    (tmp_path / "selfplay_study.json").write_text(json.dumps(payload))
    text = study.render(payload, tmp_path)
    assert "## default (2 seeds at commit 6be61ef12345;" in text
    assert "## no-repetition-penalty (2 seeds at commit unrecorded;" in text
    assert "| add_0-19 | yes | 0.100 | 0.100 | +0.000" in text and "| add_20-29 | no | 0.000 | 0.300 | +0.300" in text
    # default minus the arm: +0.3 learnable ratio, +0.4 unique proposals, the same ladder at step 0, and at
    # the end +0.2 on one level of the ladder
    row = next(line for line in text.splitlines() if line.startswith("| no-repetition-penalty | 2 |"))
    cells = [c.split(" [")[0] for c in row.split(" | ")[2:]]
    levels = len(study.LADDER_LEVELS)
    assert cells == ["default +0.300", "default +0.400", "default +0.000", f"default {0.2 / levels:+.3f}"]
    assert (tmp_path / "selfplay_study_default.png").exists() and (tmp_path / "selfplay_study.md").read_text() == text


def test_code_study_renders_per_seed_thirds_and_ladder_gains(tmp_path):
    """studies/selfplay_code_study.py on constructed runs: thirds of the valid-program rate, the ladder's
    mean before and after, the per-kind paired gain, a plot."""
    pytest.importorskip("matplotlib")
    from studies import selfplay_code_study as code_study

    def run(seed, loop_end):
        series = {name: [0.5] * 9 for name in code_study.SERIES}
        series["valid"] = [0.1] * 3 + [0.5] * 3 + [0.9] * 3
        ladder = {kind: [[0, 0.0], [9, 0.0]] for kind in code_study.CODE_LADDER}
        ladder["loop"] = [[0, 0.25], [5, 0.3], [9, loop_end]]
        return {"seed": seed, "steps": 9, "wall_s": 90.0, "series": series, "ladder": ladder}

    payload = {"commit": "abc123def456", "config": {"recipe": "examples/scripts/x.sh"},
               "results": {"runs": [run(2, 0.5), run(1, 0.75)]}}  # fmt: skip
    text = code_study.render(payload, tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert rows[0].startswith("| 1 | 9 | 90 | 0.5 | 0.100 / 0.500 / 0.900 |")  # sorted by seed
    assert rows[0].endswith("| 0.050 -> 0.150 |")  # the five kinds' mean: loop 0.25 -> 0.75
    assert "| loop | 0.250 | 0.625 | +0.375 [" in text
    assert (tmp_path / "selfplay_code_study.png").stat().st_size > 1000


def test_engine_start_table_reads_both_starts_of_each_mode(tmp_path):
    from benchmarks import bench_engine_start as bench

    record = {"start_s": 12.0, "decode_tok_s": 300.0, "process_s": 14.0, "cache_load_failures": 0}
    results = {"eager/first": {**record, "start_s": 15.0}, "eager/second": record}
    payload = {"commit": "abc123def456", "config": {"model_name": "m"}, "results": results}
    text = bench.render(payload, tmp_path)
    assert "| eager | 15.0 | 12.0 | 300 | 0 / 0 |" in text and "| aot |" not in text
