"""studies/compare_is_correction.py: --quick end to end, rendering, and the regression mode."""

import copy
import json

import pytest

from studies import compare_is_correction as cmp


@pytest.mark.e2e
def test_quick_runs_end_to_end(tmp_path):
    pytest.importorskip("vllm")
    assert cmp.main(["--part", "all", "--quick", "--output", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "compare_is_correction_quick.json").read_text())
    assert {"machine", "commit", "config", "results"} <= set(payload)
    est, tr = payload["results"]["estimator"], payload["results"]["training"]
    from reinforce_pro.algos.is_correction import IS_CORRECTIONS

    assert {r["correction"] for r in est["rows"]} == {"none", *IS_CORRECTIONS}
    assert {(r["condition"], r["correction"]) for r in tr["runs"]} == {("stale2", "none"), ("stale2", "reinforce_pro")}
    for run in tr["runs"]:
        assert len(run["series"]["rollout/reward_mean"]) == tr["config"]["steps"]
        assert 0.0 <= run["final_reward"] <= 1.0
    pro = next(r for r in tr["runs"] if r["correction"] == "reinforce_pro")
    assert pro["mean_is/vllm_kl"] is not None and pro["mean_rollout/logprob_abs_diff_mean"] > 1e-4  # stale engine
    none = next(r for r in tr["runs"] if r["correction"] == "none")
    assert none["mean_is/ess"] is None  # no IS correction, no is/* metrics
    text = (tmp_path / "compare_is_correction_quick.md").read_text()
    assert "### Part 1" in text and "### Part 2" in text and "| stale2 | reinforce_pro |" in text
    for name in ("estimator", "training", "training_masked", "training_ess", "training_vllm_kl"):
        assert (tmp_path / f"compare_is_correction_quick_{name}.png").stat().st_size > 1000, name


def _payload():
    return {
        "results": {
            "estimator": {
                "rows": [{"drift": "uniform", "correction": "tis", "band": [0.5, 5.0], "mse_ratio_to_none": 0.9}]
            },
            "training": {"runs": [{"condition": "bf16", "correction": "tis", "final_reward": r} for r in (0.40, 0.42)]},
        }
    }  # fmt: skip


def test_regression_mode_flags_worse_results_only():
    old = _payload()
    assert cmp.compare(old, copy.deepcopy(old), tolerance=0.1) == []
    worse = copy.deepcopy(old)
    worse["results"]["estimator"]["rows"][0]["mse_ratio_to_none"] = 1.2
    worse["results"]["training"]["runs"] = [{"condition": "bf16", "correction": "tis", "final_reward": 0.2}]
    problems = cmp.compare(old, worse, tolerance=0.1)
    assert len(problems) == 2
    assert "MSE ratio 0.900 -> 1.200" in problems[0] and "final reward 0.410 -> 0.200" in problems[1]


def test_regression_mode_exit_status(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(_payload()))
    new.write_text(json.dumps(_payload()))
    assert cmp.main(["--render", str(new), "--compare", str(old)]) == 0
    worse = _payload()
    worse["results"]["estimator"]["rows"][0]["mse_ratio_to_none"] = 5.0
    new.write_text(json.dumps(worse))
    assert cmp.main(["--render", str(new), "--compare", str(old)]) == 1


def test_resume_skips_finished_runs_without_starting_anything():
    done = [
        {"seed": 1, "condition": "stale2", "correction": c, "final_reward": 0.3, "series": {}}
        for c in ("none", "reinforce_pro")
    ]
    out = cmp.training_part(quick=True, done=done, on_run=lambda partial: pytest.fail("nothing should run"))
    assert out["runs"] == done and out["config"]["conditions"] == ["stale2"]
