"""The second confirmation's selection rule (studies/confirmation_rule.py) on hand-made screening runs."""

from __future__ import annotations

import json

import pytest

from studies import confirmation_rule as rule

SEEDS = rule.SCREENING_SEEDS


def _run(seed, regime, correction, final_eval, collapsed=False):
    rewards = [0.3] * 10 + [0.0] * 30 if collapsed else [0.3] * 40  # 30 steps below its start: a reward collapse
    return {"seed": seed, "regime": regime, "correction": correction, "final_eval": final_eval, "rewards": rewards,
            "grad_norms": [1.0] * 40}  # fmt: skip


def _regime(regime, rp, cppo, seeds=SEEDS):
    """reinforce_pro and cppo in `regime` at `seeds`, with the given held-out accuracies (one per seed)."""
    return [_run(s, regime, c, v) for s, a, b in zip(seeds, rp, cppo, strict=True) for c, v in
            (("reinforce_pro", a), ("cppo", b))]  # fmt: skip


def _mechanism(stale4_rp, stale4_cppo, variants=None, parent_collapsed=()):
    """The mechanism screening's stale4 runs: reinforce_pro (collapsed at the seeds named), cppo, and each variant
    at every seed, by default at 0.5 and never collapsed; `variants` maps a name to (evals, collapsed seeds)."""
    runs = [_run(s, "stale4", "reinforce_pro", v, s in parent_collapsed) for s, v in zip(SEEDS, stale4_rp, strict=True)]
    runs += [_run(s, "stale4", "cppo", v) for s, v in zip(SEEDS, stale4_cppo, strict=True)]
    for name in rule.VARIANTS:
        evals, collapsed = (variants or {}).get(name, ((0.5, 0.5, 0.5), ()))
        runs += [_run(s, "stale4", name, v, s in collapsed) for s, v in zip(SEEDS, evals, strict=True)]
    return runs


def test_the_regime_with_the_highest_mean_difference_is_chosen_and_stale4_is_read_from_the_mechanism_runs():
    regime_runs = [
        *_regime("partial", (0.8, 0.7, 0.9), (0.7, 0.7, 0.8)),  # +0.10, 0, +0.10: mean +0.0667
        *_regime("fp8", (0.9, 0.9, 0.9), (0.8, 0.9, 0.9)),  # mean +0.0333
        *_regime("stale2+partial", (0.5, 0.5, 0.5), (0.6, 0.6, 0.6)),  # -0.10
        *_regime("stale4", (1.0, 1.0, 1.0), (0.0, 0.0, 0.0)),
    ]  # not read: stale4 is the mechanism's
    result = rule.apply_rule(regime_runs, _mechanism((0.9, 0.8, 0.7), (0.8, 0.8, 0.8)))  # stale4: 0
    by_regime = result["regime"]["by_regime"]
    assert by_regime["stale4"]["diffs"] == pytest.approx({"501": 0.1, "502": 0.0, "503": -0.1})
    assert by_regime["partial"]["mean"] == pytest.approx(0.2 / 3) and by_regime["fp8"]["mean"] == pytest.approx(0.1 / 3)
    assert by_regime["stale2+partial"]["mean"] == pytest.approx(-0.1)
    assert result["regime"]["chosen"] == "partial"
    # every variant at 0.5, none collapsed: a tie the rule does not break, so nothing is complete
    assert result["variant"]["reason"].startswith("a tie the committed rule does not break: reinforce_pro-sign, ")
    assert not result["complete"] and result["arms"] is None
    result = rule.apply_rule(regime_runs, _mechanism((0.9, 0.8, 0.7), (0.8, 0.8, 0.8),
                                                     {"reinforce_pro-tv": ((0.6, 0.6, 0.6), ())}))  # fmt: skip
    assert result["complete"] and result["arms"] == ["reinforce_pro", "cppo", "reinforce_pro-tv", "dppo-tv", "none",
                                                     "sync"]  # fmt: skip


def test_where_reinforce_pro_trails_cppo_everywhere_the_rule_takes_stale4_not_the_least_bad_regime():
    regime_runs = [*_regime("partial", (0.7,) * 3, (0.8,) * 3), *_regime("fp8", (0.79,) * 3, (0.8,) * 3),
                   *_regime("stale2+partial", (0.6,) * 3, (0.8,) * 3)]  # fmt: skip
    result = rule.apply_rule(regime_runs, _mechanism((0.5,) * 3, (0.8,) * 3))
    assert result["regime"]["by_regime"]["fp8"]["mean"] == pytest.approx(-0.01)  # the highest, and below 0
    assert result["regime"]["chosen"] == "stale4" and "trails cppo in every regime" in result["regime"]["reason"]


def test_two_regimes_at_the_same_highest_mean_are_a_tie_the_rule_does_not_break():
    regime_runs = [*_regime("partial", (0.8,) * 3, (0.7,) * 3), *_regime("fp8", (0.9,) * 3, (0.8,) * 3),
                   *_regime("stale2+partial", (0.6,) * 3, (0.8,) * 3)]  # fmt: skip
    result = rule.regime_choice([*regime_runs, *_regime("stale4", (0.5,) * 3, (0.5,) * 3)])
    assert result["chosen"] is None and result["reason"] == "a tie the committed rule does not break: partial, fp8"


def test_nothing_is_chosen_while_a_regime_or_a_variant_lacks_a_seed_and_other_seeds_are_not_read():
    regime_runs = [
        *_regime("partial", (0.8,) * 3, (0.7,) * 3),
        *_regime("fp8", (0.8,) * 3, (0.7,) * 3),
        *_regime("stale2+partial", (0.8, 0.8), (0.7, 0.7), seeds=SEEDS[:2]),
        *_regime("stale2+partial", (0.9,), (0.1,), seeds=(301,)),
    ]  # a confirmation seed: not read
    result = rule.apply_rule(regime_runs, _mechanism((0.5,) * 3, (0.5,) * 3))
    assert result["regime"]["chosen"] is None and not result["complete"] and result["arms"] is None
    assert result["regime"]["reason"] == "incomplete: fewer than 3 seeds in stale2+partial"
    mechanism = [
        r for r in _mechanism((0.5,) * 3, (0.5,) * 3) if (r["correction"], r["seed"]) != ("reinforce_pro-tv", 503)
    ]
    variant = rule.variant_choice(mechanism)
    assert variant["chosen"] is None and variant["reason"] == "incomplete: fewer than 3 seeds for reinforce_pro-tv"
    assert "The rule picks nothing until both screenings have their 3 seeds." in rule.render(result)


@pytest.mark.parametrize(
    "variants, parent_collapsed, chosen, reason",
    [
        pytest.param({"reinforce_pro-tv": ((0.9, 0.9, 0.9), ())}, (), "reinforce_pro-tv", None, id="highest-mean"),
        # the highest mean, but it collapsed at a seed where reinforce_pro did not: the next best
        pytest.param(
            {"reinforce_pro-tv": ((0.9, 0.9, 0.9), (502,)), "reinforce_pro-pos": ((0.6, 0.6, 0.6), ())},
            (),
            "reinforce_pro-pos",
            None,
            id="more-collapses-disqualify",
        ),
        # as many collapses as reinforce_pro: it qualifies
        pytest.param(
            {"reinforce_pro-tv": ((0.9, 0.9, 0.9), (502,))}, (501,), "reinforce_pro-tv", None, id="as-many-qualify"
        ),
        # two at the same mean: the one with fewer collapses
        pytest.param(
            {"reinforce_pro-tv": ((0.9, 0.9, 0.9), (501,)), "reinforce_pro-tis": ((0.9, 0.9, 0.9), ())},
            (501,),
            "reinforce_pro-tis",
            None,
            id="tie-to-fewer-collapses",
        ),
        pytest.param(
            {name: ((0.9, 0.9, 0.9), (503,)) for name in rule.VARIANTS},
            (),
            None,
            "no variant collapsed at as few seeds",
            id="none-qualifies",
        ),
        pytest.param(
            {"reinforce_pro-tv": ((0.9, 0.9, 0.9), ()), "reinforce_pro-tis": ((0.9, 0.9, 0.9), ())},
            (),
            None,
            "a tie the committed rule does not break: reinforce_pro-tv, reinforce_pro-tis",
            id="full-tie-unbroken",
        ),
    ],
)
def test_the_variant_is_the_best_mean_among_those_that_collapse_no_more_than_reinforce_pro(
    variants, parent_collapsed, chosen, reason
):
    result = rule.variant_choice(_mechanism((0.5,) * 3, (0.5,) * 3, variants, parent_collapsed))
    assert result["chosen"] == chosen
    assert result["reason"] == (reason or "the highest mean held-out accuracy")


def test_main_writes_the_rule_s_json_and_table(tmp_path):
    regime_runs = [*_regime("partial", (0.8,) * 3, (0.7,) * 3), *_regime("fp8", (0.8,) * 3, (0.9,) * 3),
                   *_regime("stale2+partial", (0.8,) * 3, (0.8,) * 3)]  # fmt: skip
    for name, runs in (("regime", regime_runs), ("mechanism", _mechanism((0.5,) * 3, (0.6,) * 3))):
        (tmp_path / f"{name}.json").write_text(json.dumps({"results": {"runs": runs}}))
    assert rule.main(["--regime-screening", str(tmp_path / "regime.json"), "--mechanism-screening",
                      str(tmp_path / "mechanism.json"), "--output", str(tmp_path)]) == 0  # fmt: skip
    payload = json.loads((tmp_path / f"{rule.NAME}.json").read_text())
    assert payload["results"]["regime"]["chosen"] == "partial" and payload["config"]["seeds"] == list(SEEDS)
    text = (tmp_path / f"{rule.NAME}.md").read_text()
    assert "| partial | +0.100 | +0.100 | +0.100 | +0.100 |" in text and "| stale4 | -0.100 | -0.100 | -0.100 |" in text
    assert "Regime chosen: partial (the highest mean reinforce_pro - cppo)." in text
    assert "| reinforce_pro-sign | 0.500 | 0.500 | 0.500 | 0.500 | 0 / 0 | yes |" in text


@pytest.mark.parametrize("seeds", [8, 12])
def test_the_confirmation_s_registered_analysis_sign_flip_mcnemar_and_tost_where_both_are_open(seeds):
    """`reinforce_pro` 0.05 below `cppo` at every seed; `dppo-tv` 0.01 above and below it in turn; the variant
    collapses (0.25) at all but the last two seeds, where it ends at 0.81."""
    runs = []
    for s in range(1, seeds + 1):
        collapsed = s <= seeds - 2
        runs += [_run(s, "stale4", "cppo", 0.8), _run(s, "stale4", "reinforce_pro", 0.75),
                 _run(s, "stale4", "dppo-tv", 0.75 + (0.01 if s % 2 else -0.01)),
                 _run(s, "stale4", "reinforce_pro-tv", 0.25 if collapsed else 0.81, collapsed)]  # fmt: skip
    rows = {(r["design"], r["other"]): r for r in rule.confirmation_verdicts(runs, "stale4", "reinforce_pro-tv")}
    assert list(rows) == rule.comparisons("reinforce_pro-tv") and len(rows) == 5
    n = 2.0**seeds
    rp_cppo, rp_dppo = rows["reinforce_pro", "cppo"], rows["reinforce_pro", "dppo-tv"]
    assert rp_cppo["p_sign_flip"] == pytest.approx(2 / n) and (rp_cppo["lower"], rp_cppo["higher"]) == (seeds, 0)
    assert rp_dppo["p_sign_flip"] == 1.0 and rp_dppo["p_collapse"] == 1.0  # differences +-0.01 summing to 0
    for other in ("cppo", "dppo-tv", "reinforce_pro"):
        # the collapsed seeds' six (ten) large differences must all keep their sign: 4 patterns each side
        row = rows["reinforce_pro-tv", other]
        assert row["p_sign_flip"] == pytest.approx(8 / n) and row["p_collapse"] == pytest.approx(2 / 2 ** (seeds - 2))
        assert (row["collapsed_design"], row["collapsed_other"]) == (seeds - 2, 0)
    assert rp_cppo["p_sign_flip_holm"] == pytest.approx(5 * 2 / n)
    assert rp_cppo["verdict"] == "lower" and "p_tost_holm" not in rp_cppo
    assert rp_dppo["verdict"] == "equivalent within ±0.03" and rp_dppo["p_tost_holm"] < 0.001
    variant = rows["reinforce_pro-tv", "cppo"]["verdict"]
    assert variant == ("not established" if seeds == 8 else "lower; collapses more often")
    assert rule.comparisons(None) == [("reinforce_pro", "cppo"), ("reinforce_pro", "dppo-tv")]
    text = rule.render_verdicts(list(rows.values()), "stale4")
    assert f"| `reinforce_pro` - `cppo` | {seeds} | -0.050 | {seeds} / 0 |" in text


def test_the_confirmation_is_analysed_with_the_regime_and_variant_the_committed_rule_picked(tmp_path):
    """--confirmation reads the rule's committed output for the regime and the variant: the analysis of a
    confirmation's JSON cannot pick either after seeing its runs."""
    runs = []
    for s in range(601, 609):  # reinforce_pro 0.05 above cppo in fp8 at every seed, 0.05 below in stale4
        for regime, sign in (("fp8", 1), ("stale4", -1)):
            runs += [_run(s, regime, "cppo", 0.8), _run(s, regime, "reinforce_pro", 0.8 + sign * 0.05),
                     _run(s, regime, "dppo-tv", 0.8 + (0.01 if s % 2 else -0.01)), _run(s, regime, "none", 0.1, True),
                     _run(s, regime, "reinforce_pro+rollout", 0.82)]  # fmt: skip
    picked = {"complete": True, "regime": {"chosen": "fp8"}, "variant": {"chosen": "reinforce_pro+rollout"},
              "arms": ["reinforce_pro", "cppo", "reinforce_pro+rollout", "dppo-tv", "none", "sync"]}  # fmt: skip
    (tmp_path / f"{rule.NAME}.json").write_text(json.dumps({"results": picked}))
    (tmp_path / "is_second_confirmation.json").write_text(json.dumps({"results": {"runs": runs}}))
    assert rule.main(["--confirmation", str(tmp_path / "is_second_confirmation.json"), "--output", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "is_second_confirmation_verdicts.json").read_text())["results"]["rows"]
    assert [(r["design"], r["other"]) for r in rows] == rule.comparisons("reinforce_pro+rollout")
    assert rows[0]["mean"] == pytest.approx(0.05) and rows[0]["verdict"] == "higher"  # fp8's runs, not stale4's
    text = (tmp_path / "is_second_confirmation_verdicts.md").read_text()
    assert text.startswith("Second confirmation (fp8)") and "| `reinforce_pro` - `cppo` | 8 | +0.050 | 0 / 8 |" in text
    with pytest.raises(ValueError, match="no fp8 runs of dppo-tv"):
        rule.analyse_confirmation([r for r in runs if r["correction"] != "dppo-tv"], picked)
    with pytest.raises(ValueError, match="has not picked"):
        rule.analyse_confirmation(runs, {**picked, "complete": False})


def test_held_out_accuracies_are_compared_on_their_grid_so_tied_sign_patterns_count():
    """Accuracies come back from float32, ~1e-8 off their grid of 1/200: differences equal on the grid then
    compare unequal, and the sign-flip test dropped sign patterns that tie the observed sum. The analysis puts
    them back on the grid, so its p equals the test of the exact integer differences."""
    import numpy as np

    from studies.study_stats import on_grid, sign_flip_p

    cppo = [147, 160, 144, 167, 169, 156, 152, 163, 140, 161]  # questions right out of 200, seeds 1-10
    rp = [145, 159, 141, 168, 166, 157, 156, 166, 143, 164]
    stored = lambda k: float(np.float32(k / 200))  # noqa: E731  (as a run's summary stores it)
    runs = [_run(s, "fp8", c, stored(k)) for s, a, b in zip(range(1, 11), rp, cppo, strict=True)
            for c, k in (("reinforce_pro", a), ("cppo", b))]  # fmt: skip
    runs += [_run(s, "fp8", "dppo-tv", stored(150)) for s in range(1, 11)]
    row = rule.confirmation_verdicts(runs, "fp8", None)[0]
    exact = sign_flip_p([a - b for a, b in zip(rp, cppo, strict=True)])
    float32 = sign_flip_p([stored(a) - stored(b) for a, b in zip(rp, cppo, strict=True)])
    assert row["p_sign_flip"] == exact == pytest.approx(0.55078125) and float32 == pytest.approx(0.546875)
    assert on_grid(stored(151), 200) == 151 / 200 and on_grid(0.7512, 200) == 0.7512  # off the grid: kept


def test_a_verdict_near_the_threshold_is_reported_with_what_it_rests_on():
    """`reinforce_pro` above `cppo` by 0.005 at 9 of 12 seeds and below at 3, plus two seeds far above: the Holm
    sign-flip p lands within a factor of two of 0.05, so the row carries the Wilcoxon p, the leave-one-seed-out
    count and the two largest seeds' share; a clear verdict carries none."""
    diffs = [0.005] * 9 + [-0.005] * 3 + [0.05, 0.04]
    runs = []
    for s, d in enumerate(diffs, start=1):
        runs += [_run(s, "fp8", "cppo", 0.7), _run(s, "fp8", "reinforce_pro", 0.7 + d),
                 _run(s, "fp8", "dppo-tv", 0.9)]  # fmt: skip
    rows = rule.confirmation_verdicts(runs, "fp8", None)
    near, clear = rows
    assert 0.025 <= near["p_sign_flip_holm"] < 0.1 and "robustness" not in clear
    rb = near["robustness"]
    assert rb["top_two_share"] == pytest.approx(0.09 / sum(diffs))
    assert 0 < rb["p_wilcoxon"] < 1 and rb["p_wilcoxon_holm"] >= rb["p_wilcoxon"]
    assert 0 <= rb["leave_one_out_flips"] <= len(diffs)
    text = rule.render_verdicts(rows, "fp8")
    assert "within a factor of two of the 0.05 threshold" in text and "`reinforce_pro` - `cppo` (sign-flip p" in text
