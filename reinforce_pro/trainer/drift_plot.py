"""The drift picture: where along the responses the engine and the trainer disagree, step by step.

Every run writes `drift.png` into its run directory (and TensorBoard, under `rollout/drift`) at its end; any
run's metrics.jsonl renders it again:

    python -m reinforce_pro.trainer.drift_plot runs/<time>/metrics.jsonl [--output drift.png] [--title TEXT]

Left: the mean |trainer - engine log-prob| of the step's response tokens before its update
(`rollout_pos/logprob_abs_diff/<positions>`), by bucket of response positions (rows) and step (columns), on a
log colour scale: a stale engine lights whole columns, drift that grows within a response (a partial rollout
spanning many weight versions) the later positions of a column, a low-precision engine a faint floor everywhere.
Right: the fraction of tokens the correction masked (`is/token_masked_frac`) and the staleness the step trained
on (`async/staleness_mean`), over the same steps. A run with a teacher (on-policy distillation) gets a middle panel:
the reverse KL to the teacher (k1, `opd_pos/reverse_kl/<positions>`) by the same buckets and steps, on a linear
scale: where along the responses the student still disagrees with its teacher.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

POSITION_PREFIX = "rollout_pos/logprob_abs_diff/"
OPD_PREFIX = "opd_pos/reverse_kl/"  # the reverse KL to a distillation teacher by position (algos/distill.py)
FLOOR = 1e-8  # the colour scale's lowest value: an fp32 engine on the trainer's own weights sits near it


def bucket_start(name: str) -> int:
    """The first position of a bucket named `<lo>-<hi>` or `<lo>+`."""
    return int(name.split("-")[0].rstrip("+"))


def drift_table(rows: list[dict], prefix: str = POSITION_PREFIX) -> tuple[list[int], list[str], list[list[float]]]:
    """(steps, position buckets in order, matrix [bucket][step] of the `prefix` metric, by default the mean |log
    ratio|; NaN where a step's responses did not reach the bucket) from metrics rows ({"step", ...}); empty when no
    row has position metrics."""
    rows = [r for r in rows if any(k.startswith(prefix) for k in r)]
    names = sorted({k[len(prefix) :] for r in rows for k in r if k.startswith(prefix)}, key=bucket_start)
    matrix = [[_number(r.get(prefix + name)) for r in rows] for name in names]
    return [int(r["step"]) for r in rows], names, matrix


def _number(value) -> float:
    return float(value) if value is not None and math.isfinite(value) else math.nan


def draw_drift(rows: list[dict], title: str = ""):
    """A matplotlib figure of the drift picture (module docstring), or None when the rows hold no position
    metrics (a run with no response tokens)."""
    steps, names, matrix = drift_table(rows)
    if not steps:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    opd_steps, opd_names, opd_matrix = drift_table(rows, OPD_PREFIX)
    if opd_steps:
        fig, (heat, opd, side) = plt.subplots(1, 3, figsize=(16, 4), gridspec_kw={"width_ratios": [3, 3, 2]})
        _heat_map(fig, opd, opd_steps, opd_names, opd_matrix, "reverse KL to the teacher (k1)", cmap="viridis")
    else:
        fig, (heat, side) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    values = [[max(v, FLOOR) if not math.isnan(v) else math.nan for v in row] for row in matrix]
    finite = [v for row in values for v in row if not math.isnan(v)]
    norm = LogNorm(vmin=min(finite), vmax=max(max(finite), min(finite) * 10))
    _heat_map(fig, heat, steps, names, values, "mean |trainer - engine log-prob| before the update", cmap="magma",
              norm=norm)  # fmt: skip
    heat.set_ylabel("response positions")
    drawn = False
    for key, label in (("is/token_masked_frac", "masked fraction"), ("async/staleness_mean", "staleness")):
        series = [(int(r["step"]), _number(r.get(key))) for r in rows if r.get(key) is not None]
        if series:
            axis = side if not drawn else side.twinx()
            axis.plot(*zip(*series, strict=True), label=label, color="C0" if not drawn else "C1")
            axis.set_ylabel(label)
            drawn = True
    side.set_xlabel("step")
    side.set_title("what the correction did, and the staleness" if drawn else "no correction or staleness logged")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def _heat_map(fig, ax, steps: list[int], names: list[str], matrix, title: str, **colours) -> None:
    """One panel of the picture: `matrix` [bucket][step] as a heat map, buckets up the side, steps along the bottom,
    with its colour bar; `colours`: imshow's cmap (and norm)."""
    image = ax.imshow(matrix, aspect="auto", origin="lower", interpolation="nearest",
                      extent=(steps[0] - 0.5, steps[-1] + 0.5, -0.5, len(names) - 0.5), **colours)  # fmt: skip
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("step")
    ax.set_title(title)
    fig.colorbar(image, ax=ax)


def write_drift(rows: list[dict], out: Path, title: str = "") -> Path | None:
    """Draw the picture into `out` (PNG); None, and no file, when the rows hold no position metrics."""
    fig = draw_drift(rows, title)
    if fig is None:
        return None
    import matplotlib.pyplot as plt

    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    from reinforce_pro.trainer.logger import read_metrics

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("metrics", type=Path, help="a run's metrics.jsonl")
    p.add_argument("--output", type=Path, default=None, help="the PNG to write (default: drift.png beside it)")
    p.add_argument("--title", default="", help="a title above the picture")
    args = p.parse_args(argv)
    if not args.metrics.is_file():
        print(f"drift_plot: error: {args.metrics} is not a file", file=sys.stderr)
        return 2
    out = write_drift(read_metrics(args.metrics), args.output or args.metrics.with_name("drift.png"), args.title)
    if out is None:
        print(f"drift_plot: error: {args.metrics} has no {POSITION_PREFIX}* metrics", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
