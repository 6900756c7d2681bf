"""studies/drift_reading.py on hand-made runs: windows of the logged mismatch, arms by median, paired rows."""

from __future__ import annotations

import json
import math

import pytest

from studies import drift_reading as reading


def _run(seed, correction, drift, collapse=False, every=2):
    """A 100-step run whose logged mismatch at step t is drift(t), kept every `every` steps from step 1."""
    rewards = [0.3] * 10 + [0.0] * 90 if collapse else [0.3] * 100  # 90 steps below its start: a reward collapse
    series = {reading.KEY: [drift(1 + i * every) for i in range(100 // every)]}
    return {"seed": seed, "regime": "stale4", "correction": correction, "rewards": rewards, "grad_norms": [1.0] * 100,
            "series_step_every": every, "series": series}  # fmt: skip


def test_a_window_averages_the_steps_it_holds_and_skips_missing_values():
    run = _run(1, "cppo", lambda t: float(t))  # steps 1, 3, 5, ...: the value is the step
    assert reading.window_drift(run, 1, 10) == pytest.approx((1 + 3 + 5 + 7 + 9) / 5)
    assert reading.window_drift(run, 1, 20) == pytest.approx(10.0)  # steps 1..19
    assert reading.window_drift(run, 1, 101) == pytest.approx(50.0)  # steps 1..99
    gap = _run(1, "cppo", lambda t: math.nan if t < 6 else 1.0)
    assert reading.window_drift(gap, 1, 10) == 1.0 and reading.window_drift(gap, 1, 5) is None
    assert reading.window_drift(_run(1, "cppo", float, every=1), 1, 10) == pytest.approx(5.0)  # steps 1..9


def test_arms_are_ranked_by_early_drift_and_the_design_is_paired_over_all_and_calm_seeds(tmp_path):
    runs = []
    for seed in (1, 2, 3, 4):
        runs += [_run(seed, "reinforce_pro", lambda t, s=seed: 0.02 + 0.001 * s, collapse=seed == 4),
                 _run(seed, "cppo", lambda t: 0.01),
                 _run(seed, "none", lambda t: 0.05, collapse=True)]  # fmt: skip
    arms = reading.arm_rows(runs, "stale4")
    assert [r["arm"] for r in arms] == ["none", "reinforce_pro", "cppo"]
    assert [r["collapsed"] for r in arms] == [4, 1, 0]
    assert arms[1]["median_drift"] == pytest.approx([0.0225] * 3)  # median of 0.021 .. 0.024
    rows = {(r["other"], r["seeds"], tuple(r["window"])): r for r in reading.paired_rows(runs, "stale4")}
    everyone = rows["cppo", "all", (1, 10)]
    assert (everyone["n"], everyone["higher"], everyone["lower"]) == (4, 4, 0)
    assert everyone["p_sign_flip"] == pytest.approx(2 / 16) and everyone["median_ratio"] == pytest.approx(2.25)
    calm = rows["cppo", "neither collapsed", (1, 10)]  # seed 4: reinforce_pro collapsed
    assert (calm["n"], calm["higher"], calm["median_ratio"]) == (3, 3, pytest.approx(2.2))
    assert ("none", "neither collapsed", (1, 10)) not in rows  # none collapsed at every seed: nothing to pair
    path = tmp_path / "study.json"
    path.write_text(json.dumps({"results": {"runs": runs}}))
    assert reading.main([str(path)]) == 0
    text = (tmp_path / "study_movement.md").read_text()
    assert "| reinforce_pro | 4 | 1 | 0.0225 | 0.0225 | 0.0225 |" in text
    assert "| cppo | all | steps 1-9 | 4 | 4 / 0 | 0.1250 | 2.25 |" in text
    config = json.loads((tmp_path / "study_movement.json").read_text())["config"]
    assert config["windows"] == [[1, 10], [1, 20], [1, 101]]
