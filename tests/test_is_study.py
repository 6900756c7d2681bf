"""The IS study's statistics and analysis (studies/study_stats.py, studies/is_study.py) on constructed runs."""

from __future__ import annotations

import math

import pytest

from studies.study_stats import collapsed, detectable_difference, paired_bootstrap, verdict


def test_paired_bootstrap_interval_brackets_the_mean_and_excludes_zero_for_a_clear_gain():
    diffs = [0.05, 0.07, 0.06, 0.04, 0.08, 0.05, 0.06, 0.07]
    mean, low, high = paired_bootstrap(diffs)
    assert mean == pytest.approx(0.06)
    assert 0 < low < mean < high < 0.08
    assert verdict(diffs) == "better" and verdict([-d for d in diffs]) == "worse"


def test_noise_gives_no_difference_with_the_detectable_size():
    diffs = [0.1, -0.12, 0.05, -0.03, 0.08, -0.1, 0.02, -0.04]
    _, low, high = paired_bootstrap(diffs)
    assert low < 0 < high
    sd = math.sqrt(sum((d + 0.005) ** 2 for d in diffs) / 7)  # mean -0.005
    assert detectable_difference(diffs) == pytest.approx((1.959964 + 0.841621) * sd / math.sqrt(8), rel=1e-6)
    assert verdict(diffs).startswith("no difference at 8 seeds (detectable: 0.")
    assert detectable_difference([0.1]) == math.inf


@pytest.mark.parametrize(
    "rewards, norms, expected",
    [
        pytest.param([0.3] * 10 + [0.31, 0.29] * 20, [1.0] * 50, False, id="flat-noisy"),
        pytest.param([0.3] * 10 + [0.1] * 25, [1.0] * 35, True, id="reward-drops"),
        pytest.param([0.3] * 10 + [0.1] * 6 + [0.4] * 20, [1.0] * 36, False, id="brief-dip"),
        pytest.param([0.3] * 30, [1.0] * 29 + [30.0], False, id="one-grad-spike"),
        pytest.param([0.3] * 30, [1.0] * 20 + [8.0] * 10, True, id="grad-blowup"),
        pytest.param([0.3] * 30, [1.0] * 29 + [float("nan")], True, id="nonfinite-grad"),
        pytest.param([0.3] * 5, [1.0] * 5, False, id="too-short"),
    ],
)
def test_collapse(rewards, norms, expected):
    assert collapsed(rewards, norms) is expected


def test_analysis_pairs_seeds_and_renders(tmp_path):
    pytest.importorskip("matplotlib")
    from studies.is_study import analyse, paired, render

    runs = []
    for seed in range(1, 6):
        for correction, final in (("none", 0.20), ("tis", 0.25), ("reinforce_pro", 0.30)):
            runs.append({
                "seed": seed, "regime": "async8-partial", "correction": correction, "steps": 10,
                "final_reward": final + 0.01 * seed, "auc_reward": final,
                "rewards": [0.3] * 10 + [0.1] * 15 if correction == "none" and seed == 1 else [0.3] * 25,
                "grad_norms": [1.0] * 25,
                "masked_frac": 0.02, "mean_abs_log_ratio": 0.1, "p99_abs_log_ratio": 0.9, "mixed_rows": 0.5,
                "versions_per_row": 1.7, "wall_s": 60.0, "series_step_every": 1,
                "series": {"rollout/reward_mean": [final] * 10},
                "positions": {} if correction == "none" else
                {"is_pos/abs_log_ratio/0-1": 0.1, "is_pos/masked/icepop/0-1": 0.02 * seed},
            })  # fmt: skip
    assert paired(runs, "async8-partial", "tis", "none", "final_reward") == pytest.approx([0.05] * 5)
    rows = {r["correction"]: r for r in analyse(runs)}
    assert rows["reinforce_pro"]["final_reward_vs_none"]["mean"] == pytest.approx(0.10)
    assert rows["reinforce_pro"]["final_reward_vs_tis"]["verdict"] == "better"
    assert rows["none"]["collapses"] == 1 and "final_reward_vs_none" not in rows["none"]
    payload = {"results": {"runs": runs}, "machine": {"cpu": "x", "cpu_count": 2, "torch": "t"}, "commit": "abc"}
    text = render(payload, tmp_path)
    assert "| async8-partial | reinforce_pro | 5 | 0.330 | **+0.100" in text
    assert (tmp_path / "is_study.png").exists() and (tmp_path / "is_study_positions.png").stat().st_size > 1000
    # positions: mean over the 10 runs with IS on (seeds 1-5 twice): icepop masks 0.02 x mean seed 3 = 6%
    assert "| async8-partial | 0-1 | 0.100 | - | 6.00% | - | - |" in text


@pytest.mark.parametrize("lag_set", [0, 1], ids=["as-fast-as-the-host", "slow-trainer"])
def test_adaptive_lag_is_compared_with_the_fixed_queues_at_its_seeds(tmp_path, lag_set):
    pytest.importorskip("matplotlib")
    from studies.is_study import LAG_SETS, REGIMES, elapsed, render

    regimes = LAG_SETS[lag_set]
    suffix = "-mb4" if lag_set else ""
    assert regimes == tuple(f"{g}{suffix}" for g in ("async4-partial", "async8-partial", "async8-adaptive"))
    if lag_set:  # the slow-trainer set: the same regimes, the trainer in micro-batches of 4 rows
        assert all(REGIMES[g].flags == {**REGIMES[g[:-4]].flags, "micro_train_batch_size": 4} for g in regimes)
    runs = []
    for seed in range(1, 5):
        for regime, final, wall in zip(regimes, (0.30, 0.36, 0.34), (70.0, 60.0, 50.0), strict=True):
            adaptive = regime == regimes[-1]
            runs.append({
                "seed": seed, "regime": regime, "correction": "reinforce_pro", "steps": 20,
                "final_reward": final + 0.01 * seed, "auc_reward": final - 0.05, "rewards": [final] * 20,
                "grad_norms": [1.0] * 20, "wall_s": wall + seed, "mean_staleness": 2.0, "series_step_every": 1,
                "series": {"rollout/reward_mean": [final] * 20},
                "step_s": [2.0] * 20 if adaptive else None, "mean_lag": 3.5 if adaptive else None,
            })  # fmt: skip
    runs.append({**runs[0], "seed": 9})  # a fixed-queue seed the adaptive arm did not run: left out of the table
    assert elapsed(runs[0])[:2] == pytest.approx([71.0 / 20, 71.0 * 2 / 20])  # wall time spread evenly
    assert elapsed(runs[2])[-1] == pytest.approx(40.0)  # the logged step times, summed
    payload = {"results": {"runs": runs}, "machine": {"cpu": "x", "cpu_count": 2, "torch": "t"}, "commit": "abc"}
    text = render(payload, tmp_path)
    # adaptive - fixed queue 4: +0.04 final reward (every seed), -20 s wall
    fixed4 = f"| reinforce_pro | async4-partial{suffix} | 4 | 0.325 | 0.250 | 72 | 2.00 | 4 (fixed) | "
    assert fixed4 + "**+0.040 [+0.040, +0.040]** | **-20 [-20, -20]** |" in text
    assert f"| reinforce_pro | async8-adaptive{suffix} | 4 | 0.365 | 0.290 | 52 | 2.00 | 3.50 | - | - |" in text
    assert (tmp_path / f"is_study_{'lag_mb4' if lag_set else 'lag'}.png").exists()


def test_the_smollm2_arm_runs_bench_smollm2s_settings_under_its_regime_and_ranks_by_held_out(tmp_path):
    pytest.importorskip("matplotlib")
    from studies.is_study import REGIMES, held_out, render, task_config

    cfg = task_config("smollm2", str(tmp_path / "model"), 3, 20, REGIMES["smollm2-async8-partial"].flags)
    assert (cfg.loop.async_train, cfg.loop.async_queue_size, cfg.actor_optim.learning_rate) == (True, 8, 2e-5)
    assert cfg.loop.seed == 3 and cfg.data.max_samples == 80 and cfg.evaluation.temperature == 0.0
    assert cfg.data.apply_chat_template and cfg.engines.config.dtype == "bfloat16"
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 0, "eval/eval/pass@1": 0.2}\n{"step": 1, "rollout/reward_mean": 0.1}\n'
        '{"step": 2, "eval/eval/pass@1": 0.5}\n'
    )
    assert held_out(tmp_path) == [(0, 0.2), (2, 0.5)]
    runs = [
        {"seed": seed, "regime": "smollm2-async8-partial", "correction": correction, "steps": 2, "final_reward": 0.3,
         "auc_reward": 0.3, "rewards": [0.3] * 25, "grad_norms": [1.0] * 25, "wall_s": 60.0, "series_step_every": 1,
         "series": {"rollout/reward_mean": [0.3] * 2}, "start_eval": 0.2, "final_eval": end + 0.01 * seed}
        for seed in (1, 2, 3) for correction, end in (("none", 0.3), ("tis", 0.35), ("reinforce_pro", 0.5))
    ]  # fmt: skip
    payload = {"results": {"runs": runs}, "machine": {"cpu": "x", "cpu_count": 2, "torch": "t"}, "commit": "abc"}
    text = render(payload, tmp_path)
    row = "| smollm2-async8-partial | reinforce_pro | 3 | 0.200 | 0.520 | **+0.200 [+0.200, +0.200]** | **+0.150"
    assert row in text


def test_each_run_records_its_commit_tree_state_and_host(tmp_path):
    """run_provenance: a clean tree records its commit and clean=True; a dirty one clean=False with a hash of its
    diff that tells two dirty trees apart; the host id is a stable hash (Python's hash() is salted per process)."""
    import subprocess

    from benchmarks.common import run_provenance

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    clean = run_provenance(tmp_path)
    assert clean["clean"] and clean["diff_sha256"] is None and len(clean["commit"]) == 40
    (tmp_path / "a.py").write_text("x = 2\n")
    dirty = run_provenance(tmp_path)
    (tmp_path / "a.py").write_text("x = 3\n")
    other = run_provenance(tmp_path)
    assert not dirty["clean"] and dirty["commit"] == clean["commit"]
    assert dirty["diff_sha256"] and dirty["diff_sha256"] != other["diff_sha256"]
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "results.json").write_text("{}")  # the study's own output, untracked: ignored when named
    assert run_provenance(tmp_path, ignore=(tmp_path / "results.json",))["clean"]
    (tmp_path / "new.py").write_text("")  # an untracked file makes the tree dirty too
    assert not run_provenance(tmp_path)["clean"]
    assert not run_provenance(tmp_path, ignore=(tmp_path / "results.json",))["clean"]
    assert clean["host_id"] == other["host_id"] and len(clean["host_id"]) == 12 and clean["started"]


def test_paired_t_interval_and_tests_match_hand_computation():
    from studies.study_stats import paired_test, tost, varies

    r = paired_test([1.0, 2.0, 3.0, 4.0, 5.0])
    # mean 3, sd sqrt(2.5), se sqrt(0.5); t_{0.975, 4} = 2.776445 (tables): half-width 1.963243
    assert (r.n, r.mean) == (5, 3.0) and abs(r.sd - 2.5**0.5) < 1e-12
    assert abs(r.low - (3 - 1.963243)) < 1e-5 and abs(r.high - (3 + 1.963243)) < 1e-5
    assert abs(r.p_t - 0.013236) < 1e-5  # t = 4.242641 on 4 degrees of freedom
    assert abs(r.p_wilcoxon - 0.0625) < 1e-12  # exact: all 5 signs positive, 2 / 2^5
    with pytest.raises(ValueError, match="at least 2 seeds"):
        paired_test([0.1])
    # equal differences: no spread, so no t-test (a p of 0 would mark two seeds' coincidence established)
    assert paired_test([-0.01, -0.01]).p_t is None and paired_test([0.0, 0.0, 0.0]).p_t is None
    assert paired_test([-0.01, -0.01]).low == paired_test([-0.01, -0.01]).high == -0.01
    # accuracies read back from float32 (0.835 - 0.845 and 0.93 - 0.94 as the study's JSON holds them): no
    # spread, so neither a t-test nor a TOST (which would call such a pair equivalent within any margin)
    float32_pair = [0.8349999785 - 0.8450000286, 0.9300000072 - 0.9399999976]
    assert not varies(float32_pair) and paired_test(float32_pair).p_t is None
    with pytest.raises(ValueError, match="vary"):
        tost(float32_pair, 0.03)
    assert varies([0.0, 0.005]) and not varies([0.1]) and not varies([0.0, 0.0])


def test_holm_tost_and_seed_count_match_hand_computation():
    from studies.study_stats import holm, seeds_needed, tost

    # sorted 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> raised to the running maximum 0.06
    assert [round(p, 12) for p in holm([0.01, 0.04, 0.03])] == [0.03, 0.06, 0.06]
    # a comparison without a test counts in the family as p 1 and stays without one: 0.01 x 2 = 0.02
    assert [None if p is None else round(p, 12) for p in holm([0.01, None])] == [0.02, None]
    diffs = [0.01, -0.01, 0.02, 0.0, -0.02]  # mean 0, se 0.0070711
    assert tost(diffs, 0.05) < 0.002  # t = 7.07 on 4 degrees of freedom against each bound: p = 0.00105
    assert tost(diffs, 0.001) > 0.4  # a margin inside the noise: not equivalent
    assert seeds_needed(sd=0.1, delta=0.07) == 17  # ((1.959964 + 0.841621) x 0.1 / 0.07)^2 = 16.02 -> 17


@pytest.mark.parametrize("kind", ["gaussian", "accuracies", "collapses"])
def test_the_exact_sign_flip_test_equals_scipys_enumeration(kind):
    """sign_flip_p against scipy's permutation_test over every sign pattern, at 2 to 13 seeds: continuous
    differences, differences of held-out accuracies (multiples of 1/200, so many patterns tie the observed sum
    exactly and only the order of additions tells them apart) and heavy-tailed ones with zeros."""
    import math
    import random
    import statistics

    from scipy import stats

    from studies.study_stats import sign_flip_p

    rng = random.Random(kind)
    draw = {"gaussian": lambda: rng.gauss(0.02, 0.1),
            "accuracies": lambda: (rng.randrange(190) - rng.randrange(200)) / 200,
            "collapses": lambda: rng.choice([-0.9, -0.02, 0.0, 0.0, 0.015, 0.03])}[kind]  # fmt: skip
    for n in range(2, 14):  # scipy's test needs 2
        diffs = [draw() for _ in range(n)]
        if not any(diffs):
            continue
        expected = stats.permutation_test(
            (diffs,), statistics.fmean, permutation_type="samples", n_resamples=math.inf, alternative="two-sided"
        ).pvalue
        assert sign_flip_p(diffs) == pytest.approx(expected, abs=1e-15), (n, diffs)
    assert sign_flip_p([0.1] * 30) == pytest.approx(2 / 2**30)  # only the all-plus and all-minus patterns
    with pytest.raises(ValueError, match="41 seeds is beyond its 40"):
        sign_flip_p([0.1] * 41)


def test_direction_counts_sides_with_exact_sign_and_sign_flip_tests():
    from studies.study_stats import detectable_at, direction

    # one large positive outlier among four small negatives: the heavy tail a collapse makes
    d = direction([-0.1, -0.1, -0.1, -0.1, 0.0, 0.5])
    assert (d.lower, d.higher, d.ties) == (4, 1, 1)
    assert abs(d.p_sign - 12 / 32) < 1e-12  # P(<= 1 or >= 4 of 5 fair signs) = 2 x (1 + 5) / 32
    # observed sum +0.1; every one of the 64 sign patterns of (0.1 x 4, 0, 0.5) sums to an odd multiple of 0.1
    # (0.5 +- four 0.1s), so each is at least as extreme: p = 1, where the t-test sees a mean near 0 too
    assert d.p_sign_flip == 1.0
    tight = direction([-0.1] * 8)
    assert (tight.lower, tight.p_sign, tight.p_sign_flip) == (8, 2 / 256, 2 / 256)
    assert direction([0.0, 0.0]).p_sign_flip == 1.0
    # alpha 0.05, 16 seeds, 80% power: effect size 0.7450 (statsmodels), so 0.745 x sd
    diffs = [(-1) ** i * 0.1 for i in range(16)]
    assert abs(detectable_at(diffs, 0.05) - 0.7450 * 0.1032796) < 1e-3
    assert detectable_at(diffs, 0.05 / 8) > detectable_at(diffs, 0.05)


def test_the_paired_collapse_rate_test_is_exact_mcnemar():
    from studies.study_stats import paired_rate_test

    # 5 seeds collapse under a only, none under b only: two-sided sign test 2 / 2^5
    a, b = [True] * 5 + [False] * 11, [False] * 16
    assert abs(paired_rate_test(a, b) - 2 / 32) < 1e-12
    assert paired_rate_test([True, True, False], [True, True, False]) == 1.0  # no discordant seed
    assert abs(paired_rate_test([True, False, False], [False, True, True]) - 1.0) < 1e-12  # 1 vs 2: p = 1


def test_collapse_kinds_name_what_collapsed():
    from studies.study_stats import collapse_kinds

    flat = [0.3] * 40
    assert collapse_kinds(flat, [1.0] * 40) == []
    assert collapse_kinds([0.3] * 10 + [0.1] * 30, [1.0] * 40) == ["reward"]
    assert collapse_kinds(flat, [1.0] * 30 + [20.0] * 10) == ["grad_norm"]  # median 1, last 10 steps at 20
    assert collapse_kinds([0.3] * 10 + [0.1] * 30, [1.0] * 39 + [float("nan")]) == ["reward", "grad_norm"]
