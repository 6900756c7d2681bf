"""Which IS correction helps, when, and at what cost.

    python -m studies.compare_is_correction --part all            # full study (~55 minutes on 2 CPU cores)
    python -m studies.compare_is_correction --part all --quick    # a few minutes: what CI can afford
    python -m studies.compare_is_correction --render studies/results/compare_is_correction.json
    python -m studies.compare_is_correction --compare OLD.json --render NEW.json   # regression check

Part 1 (`estimator`, see is_estimator_study.py): exact-gradient study of each correction x threshold band
under five drift patterns; bias, variance, MSE (as ratios to no correction), cosine to the exact gradient,
fraction of tokens kept.

Part 2 (`training`): the embedded default task (tiny Qwen2 warm-started on additions, reinforce_baseline),
one run per correction (none = IS off) under each condition, same seeds:
- control: fp32 engine and fp32 trainer, fresh weights (no mismatch beyond ~1e-6);
- bf16: a bf16 engine sampling for the fp32 trainer (real numeric mismatch);
- stale1 / stale2 / stale4: fp32 engine whose weights are 1, 2, 4 steps old (--rollout_staleness), the
  synchronous imitation of asynchronous RL's lag;
- async1 / async2: real asynchronous training (--async_train, --async_queue_size 1 / 2), fp32 engine: the
  lag is whatever the producer achieves, at most the queue size (async/staleness_mean is recorded).
Per run: final reward (mean of the last 10 steps), area under the reward curve (mean reward over the run),
steps until the 10-step moving average first gains +0.10 over the start, the is/* metrics over time,
gradient-norm spikes (steps above 3x the run's median), and wall time. One Ray cluster and one engine per
dtype serve every run.

All results go to one JSON (machine, commit, configuration); tables (markdown) and plots (PNG) are rendered
from it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

import reinforce_pro  # noqa: F401  (before ray: keeps a local cluster on loopback, see ray_env.py)
from benchmarks.common import scratch_dir, write_result
from studies import RESULTS_DIR
from studies.runs import base_config, summarise_run, warm_start

CONDITIONS = {  # name -> (engine dtype, --rollout_staleness, --async_queue_size; 0: synchronous)
    "control": ("float32", 0, 0),
    "bf16": ("bfloat16", 0, 0),
    "stale1": ("float32", 1, 0),
    "stale2": ("float32", 2, 0),
    "stale4": ("float32", 4, 0),
    "async1": ("float32", 0, 1),
    "async2": ("float32", 0, 2),
}
TRAIN_CORRECTIONS = ["none", "tis", "icepop", "seq-mask-tis", "reinforce_pro"]


# ------------------------------------------------------------------------------------------ part 1
def estimator_part(quick: bool) -> dict:
    from tqdm import tqdm

    from studies.is_estimator_study import DRIFTS, correction_bands, run_study

    config = {"symbols": 3, "horizon": 5, "batch_size": 64, "batches": 40 if quick else 400, "seed": 0}
    bar = tqdm(total=len(DRIFTS) * len(correction_bands()), desc="estimator study")
    rows = run_study(progress=lambda: bar.update(1), **config)
    bar.close()
    return {"config": config, "rows": rows}


# ------------------------------------------------------------------------------------------ part 2


def run_config_for(base, correction: str, condition: str, save: Path):
    """`base` with one correction (none: IS off) under one condition, writing to `save`."""
    from dataclasses import replace

    dtype, staleness, queue = CONDITIONS[condition]
    surrogate = replace(base.loss.surrogate, enable_vllm_is_correction=correction != "none")
    if correction != "none":
        surrogate = replace(surrogate, vllm_is_correction_type=correction)
    return replace(
        base,
        loss=replace(base.loss, surrogate=surrogate),
        engines=replace(base.engines, config=replace(base.engines.config, dtype=dtype)),
        loop=replace(base.loop, rollout_staleness=staleness, async_train=queue > 0, async_queue_size=max(1, queue)),
        output=replace(base.output, save_path=str(save)),
    )


def training_part(quick: bool, done: list[dict] | None = None, on_run=None) -> dict:
    """Every seed x condition x correction run. `done`: runs of an interrupted study (skipped here);
    `on_run(partial_result)` is called after each run so the caller can save progress."""
    import ray

    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine
    from reinforce_pro.run.driver import build_and_fit
    from reinforce_pro.run.prepare import prepare
    from reinforce_pro.workers.launcher import start_ray

    seeds = [1] if quick else [1, 2, 3]
    conditions = ["stale2"] if quick else list(CONDITIONS)  # quick: one condition, so one engine to start
    corrections = ["none", "reinforce_pro"] if quick else TRAIN_CORRECTIONS
    steps = 10 if quick else 100
    config = {"seeds": seeds, "conditions": conditions, "corrections": corrections, "steps": steps}
    runs = list(done or [])
    finished = {(r["seed"], r["condition"], r["correction"]) for r in runs}
    pending = {
        seed: [(c, k) for c, k in itertools.product(conditions, corrections) if (seed, c, k) not in finished]
        for seed in seeds
    }
    if not any(pending.values()):
        return {"config": config, "runs": runs}
    with scratch_dir("compare_is_") as workdir:
        start_ray(logical_cpus=8)
        for seed, todo in pending.items():
            if not todo:
                continue
            pretrain = warm_start(seed, workdir)
            base = base_config(pretrain, seed, steps)
            engine_cls = ray.remote(VLLMEngine).options(num_cpus=1)
            dtypes = sorted({CONDITIONS[c][0] for c in conditions})  # each condition's engine dtype
            engines = {
                dtype: engine_cls.remote(EngineConfig(model_path=pretrain, dtype=dtype, seed=seed, max_model_len=64))
                for dtype in dtypes
            }
            # warm-up (vLLM compiles on its first generate): keep it out of the first run's wall time
            ray.get([e.generate.remote([[1, 21, 15, 22, 33]], {"max_tokens": 4}) for e in engines.values()])
            for condition, correction in todo:
                print(f"[training] seed {seed} {condition} {correction}", flush=True)
                save = workdir / f"{seed}_{condition}_{correction}"
                cfg = run_config_for(base, correction, condition, save)
                start = time.perf_counter()
                history = build_and_fit(cfg, prepare(cfg), engines=[engines[cfg.engines.config.dtype]])
                runs.append({"seed": seed, "condition": condition, "correction": correction,
                             **summarise_run(history, time.perf_counter() - start)})  # fmt: skip
                if on_run is not None:
                    on_run({"config": config, "runs": runs})
            for engine in engines.values():
                ray.kill(engine)
    return {"config": config, "runs": runs}


# ------------------------------------------------------------------------------------------ output
def render(payload: dict, out_dir: Path) -> str:
    r, parts, stem = payload["results"], [], payload["benchmark"]
    if "estimator" in r:
        parts.append(_estimator_table(r["estimator"]))
        _estimator_plot(r["estimator"], out_dir / f"{stem}_estimator.png")
    if "training" in r:
        parts.append(_training_table(r["training"]))
        _training_plot(r["training"], "rollout/reward_mean", out_dir / f"{stem}_training.png")
        for key, name in (("is/token_masked_frac", "masked"), ("is/ess", "ess"), ("is/vllm_kl", "vllm_kl")):
            _training_plot(r["training"], key, out_dir / f"{stem}_training_{name}.png")
    m = payload["machine"]
    parts.append(f"_{m['cpu']} ({m['cpu_count']} cores), torch {m['torch']}, commit {payload['commit'][:12]}._")
    text = "\n\n".join(parts)
    (out_dir / f"{stem}.md").write_text(text + "\n")
    return text


def _estimator_table(est: dict) -> str:
    rows = est["rows"]
    lines = [
        f"### Part 1: estimator study ({est['config']['batches']} batches of {est['config']['batch_size']}; "
        f"{est['config']['symbols']} symbols, horizon {est['config']['horizon']})",
        "",
        "MSE of the gradient estimate as a ratio to no correction (lower is better), cosine of the mean "
        "estimate with the exact gradient, fraction of tokens kept.",
        "",
        "| drift | mean abs log ratio | none cos | correction | band | MSE ratio | bias^2 ratio | var ratio | cos | kept |",  # noqa: E501
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for drift in dict.fromkeys(row["drift"] for row in rows):
        base = next(x for x in rows if x["drift"] == drift and x["correction"] == "none")
        for x in rows:
            if x["drift"] != drift or x["correction"] == "none":
                continue
            band = "-".join(f"{b:g}" for b in x["band"])
            lines.append(
                f"| {drift} | {x['mean_abs_log_ratio']:.2f} | {base['cos_mean_estimate']:.2f} | {x['correction']} | "
                f"{band} | {x['mse_ratio_to_none']:.2f} | {x['bias2_ratio_to_none']:.2f} | "
                f"{x['variance_ratio_to_none']:.2f} | {x['cos_mean_estimate']:.2f} | {x['kept_frac']:.2f} |"
            )
    return "\n".join(lines)


def _spread(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def _mean(runs: list[dict], key: str, fmt: str) -> str:
    values = [x[key] for x in runs if x.get(key) is not None]
    return format(statistics.mean(values), fmt) if values else "n/a"


def _training_table(tr: dict) -> str:
    runs, cfg = tr["runs"], tr["config"]
    lines = [
        f"### Part 2: training under mismatch ({cfg['steps']} steps, seeds {cfg['seeds']}; mean ± std [min, max])",
        "",
        "| condition | correction | final reward | reward AUC | steps to +0.10 | staleness | mean abs dlogp | masked frac | ESS | vllm_kl | grad-norm spikes | wall s |",  # noqa: E501
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for condition, correction in itertools.product(cfg["conditions"], cfg["corrections"]):
        sel = [x for x in runs if x["condition"] == condition and x["correction"] == correction]
        if not sel:
            continue
        reached = [x["steps_to_plus_0.10"] for x in sel]
        reached_txt = ", ".join("-" if v is None else str(v) for v in reached)
        lines.append(
            f"| {condition} | {correction} | {_spread([x['final_reward'] for x in sel])} | "
            f"{_spread([x['auc_reward'] for x in sel])} | {reached_txt} | {_mean(sel, 'mean_staleness', '.2f')} | "
            f"{_mean(sel, 'mean_rollout/logprob_abs_diff_mean', '.2e')} | {_mean(sel, 'mean_is/token_masked_frac', '.4f')} | "  # noqa: E501
            f"{_mean(sel, 'mean_is/ess', '.3f')} | {_mean(sel, 'mean_is/vllm_kl', '.2e')} | "
            f"{sum(x['grad_norm_spikes'] for x in sel)} | {statistics.mean(x['wall_s'] for x in sel):.0f} |"
        )  # fmt: skip
    return "\n".join(lines)


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _estimator_plot(est: dict, path: Path) -> None:
    plt = _plt()
    if plt is None:
        return
    rows = [x for x in est["rows"] if x["correction"] != "none" and x["band"] == [0.5, 5.0]]
    drifts = list(dict.fromkeys(x["drift"] for x in rows))
    corrections = list(dict.fromkeys(x["correction"] for x in rows))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(corrections)
    for i, c in enumerate(corrections):
        ys = [next(x["mse_ratio_to_none"] for x in rows if x["drift"] == d and x["correction"] == c) for d in drifts]
        ax.bar([j + i * width for j in range(len(drifts))], ys, width, label=c)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(drifts))], drifts, fontsize=8)
    ax.set_ylabel("MSE / MSE(no correction)")
    ax.set_title("Gradient-estimate MSE by drift pattern, band [0.5, 5]")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _training_plot(tr: dict, key: str, path: Path) -> None:
    """`key` over the steps, one panel per condition, one line per correction (5-step mean; band: min-max
    over seeds). Runs that do not log `key` (no IS correction -> no is/*) are left out."""
    plt = _plt()
    if plt is None:
        return
    runs, cfg = tr["runs"], tr["config"]
    fig, axes = plt.subplots(1, len(cfg["conditions"]), figsize=(3.2 * len(cfg["conditions"]), 3.2), sharey=True)
    axes = [axes] if len(cfg["conditions"]) == 1 else axes
    for ax, condition in zip(axes, cfg["conditions"], strict=True):
        for correction in cfg["corrections"]:
            sel = [x for x in runs if x["condition"] == condition and x["correction"] == correction]
            curves = [x["series"][key] for x in sel if not any(math.isnan(v) for v in x["series"][key])]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            smooth = [[statistics.mean(c[max(0, i - 4) : i + 1]) for i in range(n)] for c in curves]
            mean = [statistics.mean(col) for col in zip(*smooth, strict=True)]
            lo = [min(col) for col in zip(*smooth, strict=True)]
            hi = [max(col) for col in zip(*smooth, strict=True)]
            xs = [i * sel[0]["series_step_every"] + 1 for i in range(n)]
            (line,) = ax.plot(xs, mean, label=correction, lw=1.2)
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
        ax.set_title(condition, fontsize=9)
        ax.set_xlabel("step")
    axes[0].set_ylabel(f"{key} (5-step mean)")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare(old: dict, new: dict, tolerance: float) -> list[str]:
    """Regressions of `new` against `old`: estimator MSE ratios that grew by more than `tolerance`
    (relative), and training final rewards that fell below the old spread."""
    problems = []
    old_est = {
        (x["drift"], x["correction"], str(x["band"])): x for x in old["results"].get("estimator", {}).get("rows", [])
    }
    for x in new["results"].get("estimator", {}).get("rows", []):
        o = old_est.get((x["drift"], x["correction"], str(x["band"])))
        if o and x["mse_ratio_to_none"] > o["mse_ratio_to_none"] * (1 + tolerance):
            problems.append(
                f"estimator {x['drift']}/{x['correction']}/{x['band']}: MSE ratio "
                f"{o['mse_ratio_to_none']:.3f} -> {x['mse_ratio_to_none']:.3f}"
            )
    old_runs = old["results"].get("training", {}).get("runs", [])
    for key in {(x["condition"], x["correction"]) for x in new["results"].get("training", {}).get("runs", [])}:
        before = [x["final_reward"] for x in old_runs if (x["condition"], x["correction"]) == key]
        after = [
            x["final_reward"] for x in new["results"]["training"]["runs"] if (x["condition"], x["correction"]) == key
        ]
        if before and statistics.mean(after) < min(before) - tolerance:
            problems.append(
                f"training {key}: final reward {statistics.mean(before):.3f} -> {statistics.mean(after):.3f}"
            )
    return problems  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["estimator", "training", "all"], default="all", help="which part to run")
    p.add_argument("--quick", action="store_true", help="a few minutes: fewer batches, seeds, conditions, steps")
    p.add_argument("--output", type=Path, default=RESULTS_DIR, help="directory for JSON / markdown / PNG")
    p.add_argument("--render", type=Path, default=None, help="re-render tables and plots from this JSON")
    p.add_argument("--compare", type=Path, default=None, help="baseline JSON: report regressions of --render's JSON")
    p.add_argument("--tolerance", type=float, default=0.10, help="regression tolerance (relative / absolute)")
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        help="continue an interrupted study from its <name>_partial.json (written after every training run)",
    )
    args = p.parse_args(argv)

    if args.render is not None:
        payload = json.loads(args.render.read_text())
        if args.compare is not None:
            problems = compare(json.loads(args.compare.read_text()), payload, args.tolerance)
            print("\n".join(problems) if problems else "no regression against the baseline")
            return 1 if problems else 0
        print(render(payload, args.render.parent))
        return 0
    name = "compare_is_correction_quick" if args.quick else "compare_is_correction"
    config = {"part": args.part, "quick": args.quick}
    results = json.loads(args.resume.read_text())["results"] if args.resume else {}
    if args.part in ("estimator", "all") and "estimator" not in results:
        results["estimator"] = estimator_part(args.quick)
        write_result(f"{name}_partial", config, results, args.output)
    if args.part in ("training", "all"):

        def save_progress(partial: dict) -> None:
            write_result(f"{name}_partial", config, {**results, "training": partial}, args.output)

        done = results.get("training", {}).get("runs", [])
        results["training"] = training_part(args.quick, done, save_progress)
    path = write_result(name, config, results, args.output)
    (args.output / f"{name}_partial.json").unlink(missing_ok=True)
    payload = json.loads(path.read_text())
    text = render(payload, args.output)
    print(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
