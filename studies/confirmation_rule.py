"""The second confirmation's selection rule, applied to the two screenings' JSON exactly as it was committed, and
the analysis the rule fixes for the confirmation itself (confirmation_verdicts).

    python -m studies.confirmation_rule       # reads the screenings' JSON, writes second_confirmation_rule.{json,md}
    python -m studies.confirmation_rule --confirmation FILE   # the confirmation's registered analysis of its JSON

docs/results/is-long-study.md ("The second confirmation: how its regime and arms will be chosen") fixed the rule
before the screenings' data it reads existed; this module is that text as code, so the choice is mechanical and
anyone can recompute it from the committed JSON:
- **Regime**: of `stale4`, `partial`, `fp8` and `stale2+partial`, the one whose paired difference `reinforce_pro`
  - `cppo` (held-out accuracy at the last step, mean over the screening seeds, at least 3) is highest; where
  `reinforce_pro` trails `cppo` in every regime, `stale4` (the confirmation then asks the mechanism question).
  `stale4`'s runs are the mechanism screening's, the others the regime screening's (its design says so).
- **Variant**: of the mechanism screening's `reinforce_pro` variants (all in `stale4`), the one with the highest
  mean held-out accuracy over its seeds among those that collapsed at no more of their seeds than
  `reinforce_pro` did; ties go to fewer collapses; none qualifying means no variant arm.
The rule reads `reinforce_pro` as the arm of that name (the default band); the regime screening's
`reinforce_pro@BAND` arms are reported beside it and take no part. Until every regime and variant has its 3
seeds the output says "incomplete" and names what is missing: a partial reading picks nothing. An exact tie the
rule does not break (equal means; for variants, equal collapses too) is reported as such and picks nothing: the
choice is then a deviation, made and listed by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.common import write_result
from studies import RESULTS_DIR
from studies.is_long_study import collapse_rates, values
from studies.study_stats import direction, holm, stored_runs, tost, varies

ROOT = Path(__file__).resolve().parent.parent

NAME = "second_confirmation_rule"
RULE_REGIMES = ("stale4", "partial", "fp8", "stale2+partial")
VARIANTS = ("reinforce_pro-sign", "reinforce_pro-tv", "reinforce_pro-pos", "reinforce_pro-tis", "reinforce_pro+rollout")
SCREENING_SEEDS = (501, 502, 503)  # both screenings' seeds; no confirmation uses them
MIN_SEEDS = 3
# Means are compared at this many decimals: an accuracy is a multiple of 1/200 stored as float32, so equal means
# differ by rounding noise (1e-9) and unequal ones by at least 1/600.
TIE_DIGITS = 6
MARGIN, ALPHA = 0.03, 0.05  # the confirmation's equivalence margin and level, as the rule fixes them
ARMS = ("reinforce_pro", "cppo", "dppo-tv", "none", "sync")  # and the variant, where one qualifies


def paired(runs: list[dict], regime: str, a: str, b: str) -> dict[str, float]:
    """Held-out accuracy of `a` minus that of `b` in `regime`, per screening seed both ran at (keyed by the seed
    as text, as the JSON keeps it)."""
    x, y = values(runs, regime, a, "final_eval"), values(runs, regime, b, "final_eval")
    return {str(s): x[s] - y[s] for s in SCREENING_SEEDS if s in x and s in y}


def regime_choice(runs: list[dict]) -> dict:
    """Per regime the differences `reinforce_pro` - `cppo` by seed and their mean; the chosen regime once every
    regime has MIN_SEEDS of them (None before)."""
    by_regime = {}
    for regime in RULE_REGIMES:
        diffs = paired(runs, regime, "reinforce_pro", "cppo")
        by_regime[regime] = {"diffs": diffs, "mean": statistics.fmean(diffs.values()) if diffs else None}
    missing = [g for g, r in by_regime.items() if len(r["diffs"]) < MIN_SEEDS]
    chosen, reason = None, f"incomplete: fewer than {MIN_SEEDS} seeds in {', '.join(missing)}"
    if not missing:
        means = {g: round(by_regime[g]["mean"], TIE_DIGITS) for g in RULE_REGIMES}
        top = max(means.values())
        best = [g for g in RULE_REGIMES if means[g] == top]
        if top < 0:
            chosen, reason = "stale4", "reinforce_pro trails cppo in every regime: stale4, the mechanism question"
        elif len(best) > 1:
            reason = f"a tie the committed rule does not break: {', '.join(best)}"
        else:
            chosen, reason = best[0], "the highest mean reinforce_pro - cppo"
    return {"by_regime": by_regime, "chosen": chosen, "reason": reason}


def variant_choice(runs: list[dict], regime: str = "stale4") -> dict:
    """Per variant its mean held-out accuracy and collapsed seeds against `reinforce_pro`'s on the same seeds; the
    chosen variant once every variant has MIN_SEEDS (None before, or where none qualifies)."""
    by_variant, screened = {}, [r for r in runs if r["seed"] in SCREENING_SEEDS]
    for variant in VARIANTS:
        evals = {str(s): v for s, v in values(screened, regime, variant, "final_eval").items()}
        rates = collapse_rates(screened, regime, variant, "reinforce_pro")
        by_variant[variant] = {"evals": evals, "mean": statistics.fmean(evals.values()) if evals else None,
                               "collapsed": rates["collapsed_design"], "collapsed_parent": rates["collapsed_other"],
                               "qualifies": rates["collapsed_design"] <= rates["collapsed_other"]}  # fmt: skip
    missing = [v for v, r in by_variant.items() if len(r["evals"]) < MIN_SEEDS]
    if missing:
        return {"by_variant": by_variant, "chosen": None,
                "reason": f"incomplete: fewer than {MIN_SEEDS} seeds for {', '.join(missing)}"}  # fmt: skip
    eligible = [v for v in VARIANTS if by_variant[v]["qualifies"]]
    if not eligible:
        return {"by_variant": by_variant, "chosen": None, "reason": "no variant collapsed at as few seeds"}
    rank = {v: (round(by_variant[v]["mean"], TIE_DIGITS), -by_variant[v]["collapsed"]) for v in eligible}
    best = [v for v in eligible if rank[v] == max(rank.values())]
    if len(best) > 1:
        return {"by_variant": by_variant, "chosen": None,
                "reason": f"a tie the committed rule does not break: {', '.join(best)}"}  # fmt: skip
    return {"by_variant": by_variant, "chosen": best[0], "reason": "the highest mean held-out accuracy"}


def apply_rule(regime_runs: list[dict], mechanism_runs: list[dict]) -> dict:
    """The rule over both screenings: `stale4` from the mechanism screening, every other regime from the regime
    screening (a run of another regime in either file is not read)."""
    runs = [r for r in mechanism_runs if r["regime"] == "stale4"]
    runs += [r for r in regime_runs if r["regime"] in RULE_REGIMES and r["regime"] != "stale4"]
    regime, variant = regime_choice(runs), variant_choice(runs)
    complete = regime["chosen"] is not None and not variant["reason"].startswith(("incomplete", "a tie"))
    arms = [*ARMS[:2], *([variant["chosen"]] if variant["chosen"] else []), *ARMS[2:]] if complete else None
    return {"regime": regime, "variant": variant, "complete": complete, "arms": arms}


def comparisons(variant: str | None) -> list[tuple[str, str]]:
    """The registered family: `reinforce_pro` and the variant each against `cppo` and `dppo-tv`, and the variant
    against `reinforce_pro` (5; 2 where no variant qualified)."""
    pairs = [("reinforce_pro", "cppo"), ("reinforce_pro", "dppo-tv")]
    return pairs + ([(variant, "cppo"), (variant, "dppo-tv"), (variant, "reinforce_pro")] if variant else [])


def confirmation_verdicts(runs: list[dict], regime: str, variant: str | None, margin: float = MARGIN) -> list[dict]:
    """The second confirmation's analysis as the rule fixes it. Primary: held-out accuracy at the last step, the
    exact sign-flip test of the paired differences, Holm over the family. Co-primary: the collapse rate, exact
    McNemar, Holm over the same family. Equivalence (TOST within ±`margin`, Holm over the comparisons it is
    computed for) only where both leave a comparison unresolved."""
    rows = []
    for a, b in comparisons(variant):
        x, y = values(runs, regime, a, "final_eval"), values(runs, regime, b, "final_eval")
        diffs = [x[s] - y[s] for s in sorted(x) if s in y]
        side = direction(diffs)
        rows.append({"design": a, "other": b, "n": len(diffs), "mean": statistics.fmean(diffs), "diffs": diffs,
                     "lower": side.lower, "higher": side.higher, "p_sign_flip": side.p_sign_flip,
                     **collapse_rates(runs, regime, a, b)})  # fmt: skip
    for key in ("p_sign_flip", "p_collapse"):
        for row, p in zip(rows, holm([r[key] for r in rows]), strict=True):
            row[f"{key}_holm"] = p
    open_rows = [r for r in rows if min(r["p_sign_flip_holm"], r["p_collapse_holm"]) >= ALPHA]
    with_spread = [r for r in open_rows if varies(r["diffs"])]
    for row, p in zip(with_spread, holm([tost(r["diffs"], margin) for r in with_spread]), strict=True):
        row["p_tost_holm"] = p
    for row in rows:
        row["verdict"] = confirmation_verdict(row, margin)
    for i, row in enumerate(rows):
        if ALPHA / 2 <= row["p_sign_flip_holm"] < 2 * ALPHA:  # within a factor of two of the threshold
            row["robustness"] = robustness(rows, i)
    return rows


def robustness(rows: list[dict], i: int) -> dict:
    """How much a verdict near the threshold rests on: the Wilcoxon signed-rank p (raw and Holm over the same
    family), how many seeds, left out one at a time, move the Holm sign-flip p to the other side of ALPHA, and the
    share of the summed difference its two largest seeds carry. The registered reading stays the sign-flip's."""
    from scipy import stats

    row = rows[i]
    wilcoxon = [float(stats.wilcoxon(r["diffs"]).pvalue) if any(r["diffs"]) else 1.0 for r in rows]
    others = [r["p_sign_flip"] for r in rows]
    flips = 0
    for k in range(row["n"]):
        family = others[:i] + [direction(row["diffs"][:k] + row["diffs"][k + 1 :]).p_sign_flip] + others[i + 1 :]
        flips += (holm(family)[i] < ALPHA) != (row["p_sign_flip_holm"] < ALPHA)
    total = sum(row["diffs"])
    top_two = sum(sorted(row["diffs"], key=lambda d: -d if total > 0 else d)[:2])
    return {"p_wilcoxon": wilcoxon[i], "p_wilcoxon_holm": holm(wilcoxon)[i], "leave_one_out_flips": flips,
            "top_two_share": top_two / total if total else None}  # fmt: skip


def confirmation_verdict(row: dict, margin: float) -> str:
    parts = []
    if row["p_sign_flip_holm"] < ALPHA:
        parts.append("higher" if row["mean"] > 0 else "lower")
    if row["p_collapse_holm"] < ALPHA:
        more = row["collapsed_design"] > row["collapsed_other"]
        parts.append(f"collapses {'more' if more else 'less'} often")
    if not parts and row.get("p_tost_holm", 1.0) < ALPHA:
        parts.append(f"equivalent within ±{margin:g}")
    return "; ".join(parts) or "not established"


def render_verdicts(rows: list[dict], regime: str) -> str:
    lines = [f"Second confirmation ({regime}): held-out accuracy at the last step, paired by seed; p-values Holm-"
             "adjusted over the family (exact sign-flip; exact McNemar on the collapses; TOST where both are open)",
             "", "| comparison | seeds | mean | lower / higher | sign-flip p (Holm) | collapsed | McNemar p (Holm) | "
             "TOST p (Holm) | verdict |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        tost_p = f"{r['p_tost_holm']:.4f}" if "p_tost_holm" in r else "-"
        lines.append(f"| `{r['design']}` - `{r['other']}` | {r['n']} | {r['mean']:+.3f} | {r['lower']} / "
                     f"{r['higher']} | {r['p_sign_flip_holm']:.4f} | {r['collapsed_design']} / "
                     f"{r['collapsed_other']} | {r['p_collapse_holm']:.4f} | {tost_p} | {r['verdict']} |")  # fmt: skip
    near = [r for r in rows if "robustness" in r]
    if near:
        lines += ["", "Verdicts within a factor of two of the 0.05 threshold, and what they rest on (the registered "
                  "reading is the table's):", ""]  # fmt: skip
    for r in near:
        rb, side = r["robustness"], "above" if r["p_sign_flip_holm"] < ALPHA else "below"
        share = f"; its two largest seeds carry {rb['top_two_share']:.0%} of the summed difference" \
            if rb["top_two_share"] is not None else ""  # fmt: skip
        lines.append(
            f"- `{r['design']}` - `{r['other']}` (sign-flip p {r['p_sign_flip_holm']:.4f} Holm): "
            f"{r['higher']} seeds higher, {r['lower']} lower, {r['n'] - r['higher'] - r['lower']} tied; "
            f"Wilcoxon p {rb['p_wilcoxon']:.3f} ({rb['p_wilcoxon_holm']:.3f} Holm); leaving one seed out "
            f"moves its Holm p {side} 0.05 for {rb['leave_one_out_flips']} of the {r['n']} seeds{share}."
        )
    return "\n".join(lines) + "\n"


def render(result: dict) -> str:
    """The rule's inputs seed by seed and what it picks (or that it cannot pick yet)."""
    regime, variant = result["regime"], result["variant"]
    seeds = " | ".join(f"seed {s}" for s in SCREENING_SEEDS)
    lines = ["Regime: `reinforce_pro` - `cppo`, held-out accuracy at the last step, by screening seed:", "",
             f"| regime | {seeds} | mean |", "|---|" + "---|" * (len(SCREENING_SEEDS) + 1)]  # fmt: skip
    for name, row in regime["by_regime"].items():
        cells = " | ".join(f"{row['diffs'][str(s)]:+.3f}" if str(s) in row["diffs"] else "-" for s in SCREENING_SEEDS)
        mean = f"{row['mean']:+.3f}" if row["mean"] is not None else "-"
        lines.append(f"| {name} | {cells} | {mean} |")
    lines += ["", f"Regime chosen: {regime['chosen'] or 'none yet'} ({regime['reason']}).", "",
              "Variant (`stale4`): held-out accuracy by screening seed, and seeds collapsed against `reinforce_pro`'s "
              "on the same seeds:", "", f"| variant | {seeds} | mean | collapsed / reinforce_pro's | qualifies |",
              "|---|" + "---|" * (len(SCREENING_SEEDS) + 3)]  # fmt: skip
    for name, row in variant["by_variant"].items():
        cells = " | ".join(f"{row['evals'][str(s)]:.3f}" if str(s) in row["evals"] else "-" for s in SCREENING_SEEDS)
        mean = f"{row['mean']:.3f}" if row["mean"] is not None else "-"
        lines.append(f"| {name} | {cells} | {mean} | {row['collapsed']} / {row['collapsed_parent']} | "
                     f"{'yes' if row['qualifies'] else 'no'} |")  # fmt: skip
    lines += ["", f"Variant chosen: {variant['chosen'] or 'none'} ({variant['reason']}).", ""]
    if result["complete"]:
        lines.append("Arms of the second confirmation: " + ", ".join(f"`{a}`" for a in result["arms"]) + ".")
    else:
        lines.append("The rule picks nothing until both screenings have their 3 seeds.")
    return "\n".join(lines) + "\n"


def analyse_confirmation(runs: list[dict], rule: dict) -> tuple[list[dict], str]:
    """The confirmation's registered analysis with the regime and variant the rule's output (apply_rule) picked,
    so neither can be chosen after its runs are seen. A rule that picked nothing cannot be analysed."""
    if not rule["complete"]:
        raise ValueError("the rule has not picked a regime and variant: the confirmation cannot be analysed by it")
    regime, variant = rule["regime"]["chosen"], rule["variant"]["chosen"]
    present = {r["correction"] for r in runs if r["regime"] == regime}
    missing = sorted({a for a in rule["arms"] if a != "sync"} - present)
    if missing:
        raise ValueError(f"the confirmation's JSON has no {regime} runs of {', '.join(missing)}")
    rows = confirmation_verdicts(runs, regime, variant)
    return rows, render_verdicts(rows, regime)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--regime-screening", type=Path, default=RESULTS_DIR / "is_regime_screening.json")
    p.add_argument("--mechanism-screening", type=Path, default=RESULTS_DIR / "is_mechanism_screening.json")
    p.add_argument("--output", type=Path, default=RESULTS_DIR, help="directory of the rule's JSON and table")
    p.add_argument("--confirmation", type=Path, default=None,
                   help="a confirmation's JSON: write its registered analysis (NAME_verdicts.{json,md}) by the "
                        "rule's committed output in --output")  # fmt: skip
    args = p.parse_args(argv)
    if args.confirmation is not None:
        rule = json.loads((args.output / f"{NAME}.json").read_text())["results"]
        rows, text = analyse_confirmation(stored_runs(args.confirmation), rule)
        name = f"{args.confirmation.stem}_verdicts"
        write_result(name, {"source": args.confirmation.name, "rule": f"{NAME}.json"}, {"rows": rows}, args.output)
        (args.output / f"{name}.md").write_text(text)
        print(text)
        return 0
    result = apply_rule(stored_runs(args.regime_screening), stored_runs(args.mechanism_screening))
    sources = {"regime_screening": args.regime_screening.name, "mechanism_screening": args.mechanism_screening.name}
    write_result(NAME, {"sources": sources, "seeds": SCREENING_SEEDS, "min_seeds": MIN_SEEDS}, result, args.output)
    text = render(result)
    (args.output / f"{NAME}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
