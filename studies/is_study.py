"""Which IS correction, when: the corrections on regimes that stress them, paired over seeds.

    python -m studies.is_study --seeds 1-8                       # every regime x correction (hours on 2 cores)
    python -m studies.is_study --seeds 1-2 --regimes async8-partial --corrections none reinforce_pro --steps 120
    python -m studies.is_study --render studies/results/is_study.json

The embedded default task (a tiny Qwen2 warm-started on additions, reinforce_baseline, a bf16 engine sampling
for an fp32 trainer), run under each regime with each correction (`none`: IS off). Each seed has one warm
start, one prompt order and one sampling seed shared by every correction (paired). A regime is a mechanism
users run (REGIMES): asynchronous training with deep queues and partial rollouts, off-policy reuse, a
low-precision engine; its strength (queue depth, learning rate, epochs) is chosen so that `none` degrades.

Results accumulate in one JSON (machine, commit, configuration, one record per run). The study resumes where
it stopped: a run already in the JSON (same seed, regime, correction, steps) is not run again, so it can be
stopped at any point and continued in another sitting, or extended with more seeds. Tables (verdict: the
paired difference to `none` and to `tis` with a bootstrap 95% interval) and plots are rendered from the JSON.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import reinforce_pro  # noqa: F401  (before ray: keeps a local cluster on loopback, see ray_env.py)
from benchmarks.common import PACKAGED_MODELS, run_provenance, scratch_dir
from studies.runner import study_main
from studies.runs import base_config, held_out, prepare_inputs, run_flags, summarise, warm_start
from studies.study_stats import (
    collapsed,
    detectable_difference,
    paired_bootstrap,
    verdict,
)

NAME = "is_study"
STUDY_FLAGS = {"is_position_metrics": True}  # every run logs is_pos/* (where in the responses the drift is)
CORRECTIONS = ["none", "tis", "icepop", "seq-mask-tis", "reinforce_pro", "reinforce_pro-tis"]
SMOLLM2_MODEL, SMOLLM2_DATA = PACKAGED_MODELS / "smollm2-135m-instruct", PACKAGED_MODELS / "tasks" / "chain_sum_2x1_v2"


@dataclass(frozen=True)
class Regime:
    what: str
    flags: dict  # train_ppo_ray flag dests -> values, on top of the task's own settings
    task: str = "embedded"  # TASKS


# What a run trains (recorded in the JSON's configuration)
TASKS = {
    "embedded": "the embedded default: a 0.4M-parameter Qwen2 warm-started on additions (per seed), exact-match "
    "reward; ranked by the training reward",
    "smollm2": "SmolLM2-135M-Instruct (packaged) on reasoning-gym chain_sum, bench_smollm2's run (4 prompts x 4 "
    "samples, <= 16 tokens, bf16 engine); ranked by held-out greedy exact match (50 prompts)",
}


REGIMES = {
    "bf16": Regime("the embedded default: bf16 engine, fp32 trainer, synchronous", {}),
    "bf16-lr1e-3": Regime("bf16 engine, 5x the learning rate (bigger updates)", {"actor_learning_rate": 1e-3}),
    "async4-partial": Regime(
        "asynchronous, queue 4, partial rollouts (2-token chunks), lr 5e-4",
        {"async_train": True, "async_queue_size": 4, "partial_rollout": True, "partial_rollout_chunk": 2,
         "actor_learning_rate": 5e-4},
    ),
    "async8-partial": Regime(
        "asynchronous, queue 8, partial rollouts (2-token chunks), lr 5e-4",
        {"async_train": True, "async_queue_size": 8, "partial_rollout": True, "partial_rollout_chunk": 2,
         "actor_learning_rate": 5e-4},
    ),
    "epochs4": Regime(
        "off-policy reuse: 4 epochs over each rollout batch in mini-batches of 64 (16 optimizer steps per batch)",
        {"max_epochs": 4, "train_batch_size": 64},
    ),
    "fp8": Regime(
        "FP8 rollouts: the engine quantizes its linear weights to FP8 per output channel at every sync "
        "(--vllm_quantization fp8_per_channel, layer inputs in FP8 per token), fp32 trainer, synchronous",
        {"vllm_quantization": "fp8_per_channel"},
    ),
    "fp8-lr1e-3": Regime(
        "FP8 rollouts at 5x the learning rate",
        {"vllm_quantization": "fp8_per_channel", "actor_learning_rate": 1e-3},
    ),
    "smollm2-async8-partial": Regime(
        "SmolLM2: asynchronous, queue 8, partial rollouts (4-token chunks), lr 2e-5 (4x the recipe's)",
        {"async_train": True, "async_queue_size": 8, "partial_rollout": True, "partial_rollout_chunk": 4,
         "actor_learning_rate": 2e-5},
        task="smollm2",
    ),
    "smollm2-stale4": Regime(
        "SmolLM2: synchronous, the engine samples with the policy of 4 steps ago (--rollout_staleness 4: the lag "
        "of an async queue of 4, exactly, on any host), lr 2e-5 (4x the recipe's)",
        {"rollout_staleness": 4, "actor_learning_rate": 2e-5},
        task="smollm2",
    ),
    "async8-adaptive": Regime(
        "async8-partial with adaptive staleness: the lag moves in [0, 8], one less while the mean |dlogp| is "
        "above 0.1, one more while below 0.05 (--async_lag_target 0.1)",
        {"async_train": True, "async_queue_size": 8, "partial_rollout": True, "partial_rollout_chunk": 2,
         "actor_learning_rate": 5e-4, "async_lag_target": 0.1, "async_lag_metric": "rollout/logprob_abs_diff_mean"},
    ),
}  # fmt: skip
# Adaptive staleness against the fixed queues it moves between: same seeds and corrections
LAG_REGIMES = ("async4-partial", "async8-partial", "async8-adaptive")
# The producer runs ahead only where generation is faster than training, which depends on the host (the lag
# probes: staleness 5.3 on one host, 1.0-1.2 on two others). Training in micro-batches of 4 rows (64 per step
# instead of 4) computes the same gradient (the loss is normalised by the global token count) several times
# slower, so the trainer is the slow side and the queues fill on any of these hosts.
SLOW_TRAINER = {"micro_train_batch_size": 4}
for _name in LAG_REGIMES:
    REGIMES[f"{_name}-mb4"] = Regime(
        f"{REGIMES[_name].what}; the trainer in micro-batches of 4 rows (same gradient, a slower trainer)",
        {**REGIMES[_name].flags, **SLOW_TRAINER},
    )
LAG_SETS = (LAG_REGIMES, tuple(f"{g}-mb4" for g in LAG_REGIMES))  # (fixed 4, fixed 8, adaptive) each


def with_correction(cfg, correction: str, save: Path):
    """`cfg` with one IS correction (`none`: IS off), writing to `save`."""
    surrogate = replace(cfg.loss.surrogate, enable_vllm_is_correction=correction != "none")
    if correction != "none":
        surrogate = replace(surrogate, vllm_is_correction_type=correction)
    return replace(cfg, loss=replace(cfg.loss, surrogate=surrogate), output=replace(cfg.output, save_path=str(save)))


def start_model(task: str, seed: int, workdir: Path) -> str:
    """The model every run of `task` at `seed` starts from: the embedded default's warm start for the seed,
    or the prepared SmolLM2 (the same for every seed; seeds differ in prompt order and sampling)."""
    if task == "embedded":
        return warm_start(seed, workdir)
    prepare_inputs(SMOLLM2_MODEL, SMOLLM2_DATA, n_train=2000, n_eval=50)
    return str(SMOLLM2_MODEL)


def task_config(task: str, pretrain: str, seed: int, steps: int, flags: dict):
    """The run config of `task` with a regime's `flags` on top (the correction is each run's)."""
    if task == "embedded":
        return base_config(pretrain, seed, steps, flags)
    from reinforce_pro.cli.flags_to_config import run_config
    from reinforce_pro.cli.train_ppo_ray import parse_args

    args = parse_args([*run_flags(Path(pretrain), SMOLLM2_DATA), "--seed", str(seed), "--max_samples",
                       str(4 * steps), "--eval_before_training", "--eval_steps", str(steps)])  # fmt: skip
    vars(args).update(flags)
    return run_config(args)


def regime_config(regime: str, model: str, seed: int, steps: int):
    """The config of `regime` at `seed`, its engine settings naming `model` (one engine per kind serves every
    run of a seed)."""
    cfg = task_config(REGIMES[regime].task, model, seed, steps, {**REGIMES[regime].flags, **STUDY_FLAGS})
    return replace(cfg, engines=replace(cfg.engines, config=replace(cfg.engines.config, model_path=model)))


def engine_kind(cfg) -> tuple[str, str, str | None]:
    return cfg.engines.config.model_path, cfg.engines.config.dtype, cfg.engines.config.quantization


def run_study(seeds, regimes, corrections, steps, runs: list[dict], save) -> list[dict]:
    """Run every (seed, regime, correction) not yet in `runs`; `save(runs)` after each run."""
    import ray

    from reinforce_pro.rollout.vllm_engine import VLLMEngine
    from reinforce_pro.run.driver import build_and_fit
    from reinforce_pro.run.prepare import prepare
    from reinforce_pro.workers.launcher import start_ray

    done = {(r["seed"], r["regime"], r["correction"], r["steps"]) for r in runs}
    todo = {s: [(g, c) for g in regimes for c in corrections if (s, g, c, steps) not in done] for s in seeds}
    total, count = sum(map(len, todo.values())), 0
    if not total:
        return runs
    with scratch_dir("is_study_") as workdir:
        start_ray(logical_cpus=8)
        for seed, pending in todo.items():
            if not pending:
                continue
            models = {t: start_model(t, seed, workdir) for t in {REGIMES[g].task for g, _ in pending}}
            configs = {g: regime_config(g, models[REGIMES[g].task], seed, steps) for g, _ in pending}
            engine_cls = ray.remote(VLLMEngine).options(num_cpus=1)
            engines = {  # one per (model, dtype, quantization) the pending regimes ask for
                engine_kind(cfg): engine_cls.remote(cfg.engines.config) for cfg in configs.values()
            }
            ray.get([e.generate.remote([[1, 21, 15, 22, 33]], {"max_tokens": 4}) for e in engines.values()])  # warm-up
            for regime, correction in pending:
                count += 1
                print(f"[is_study] {count}/{total}: seed {seed} {regime} {correction}", flush=True)
                cfg = with_correction(configs[regime], correction, workdir / f"{seed}_{regime}_{correction}")
                engine = engines[engine_kind(cfg)]
                ray.get(engine.reseed.remote(seed))  # paired: every correction of a seed samples its first batch alike
                provenance, start = run_provenance(), time.perf_counter()  # the code and host of this run
                plan = prepare(cfg)
                history = build_and_fit(cfg, plan, engines=[engine])
                wall = time.perf_counter() - start
                record = {"seed": seed, "regime": regime, "correction": correction, "steps": steps, **provenance}
                runs.append({**record, **summarise(history, wall, held_out(plan.run_dir))})
                save(runs)
            for engine in engines.values():
                ray.kill(engine)
    return runs


# ------------------------------------------------------------------------------------------ analysis
def by_seed(runs: list[dict], regime: str, correction: str, key: str) -> dict[int, float]:
    """seed -> `key` of the runs of one regime and correction."""
    sel = [r for r in runs if (r["regime"], r["correction"]) == (regime, correction) and r.get(key) is not None]
    return {r["seed"]: r[key] for r in sel}


def paired(runs: list[dict], regime: str, a: str, b: str, key: str) -> list[float]:
    """Per-seed differences a - b of `key` in `regime`, over the seeds where both ran."""
    first, second = by_seed(runs, regime, a, key), by_seed(runs, regime, b, key)
    return [first[s] - second[s] for s in sorted(first) if s in second]


def analyse(runs: list[dict]) -> list[dict]:
    """One row per regime x correction: means, paired differences to `none` and `tis`, verdicts, collapses."""
    rows = []
    for regime in dict.fromkeys(r["regime"] for r in runs):
        for correction in CORRECTIONS:
            sel = [r for r in runs if r["regime"] == regime and r["correction"] == correction]
            if not sel:
                continue
            row = {"regime": regime, "correction": correction, "seeds": len(sel),
                   "collapses": sum(collapsed(r["rewards"], r["grad_norms"]) for r in sel)}  # fmt: skip
            for key in ("final_reward", "auc_reward", "masked_frac", "mean_abs_log_ratio", "p99_abs_log_ratio",
                        "mixed_rows", "versions_per_row", "mean_staleness", "mean_lag", "wall_s", "start_eval",
                        "final_eval"):  # fmt: skip
                values = [r[key] for r in sel if r.get(key) is not None]
                row[key] = statistics.fmean(values) if values else None
            for base in ("none", "tis"):
                for key in ("final_reward", "auc_reward", "final_eval"):
                    diffs = paired(runs, regime, correction, base, key)
                    if correction != base and len(diffs) >= 2:
                        mean, low, high = paired_bootstrap(diffs)
                        row[f"{key}_vs_{base}"] = {"mean": mean, "low": low, "high": high, "n": len(diffs),
                                                   "detectable": detectable_difference(diffs),
                                                   "verdict": verdict(diffs)}  # fmt: skip
            rows.append(row)
    return rows


def _diff(row: dict, key: str) -> str:
    d = row.get(key)
    if d is None:
        return "-"
    mark = "**" if d["verdict"] in ("better", "worse") else ""
    return f"{mark}{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]{mark}"


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(payload: dict, out_dir: Path) -> str:
    runs = payload["results"]["runs"]
    rows = analyse(runs)
    lines = [
        "| regime | correction | seeds | final reward | vs none (95% CI) | vs tis (95% CI) | AUC vs none | "
        "collapses | masked | mean / p99 abs dlogp | staleness | mixed rows | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['regime']} | {r['correction']} | {r['seeds']} | {_fmt(r['final_reward'], '.3f')} | "
            f"{_diff(r, 'final_reward_vs_none')} | {_diff(r, 'final_reward_vs_tis')} | "
            f"{_diff(r, 'auc_reward_vs_none')} | "
            f"{r['collapses']} | {_fmt(r['masked_frac'], '.2%')} | {_fmt(r['mean_abs_log_ratio'], '.3f')} / "
            f"{_fmt(r['p99_abs_log_ratio'], '.3f')} | {_fmt(r['mean_staleness'], '.2f')} | "
            f"{_fmt(r['mixed_rows'], '.2f')} | {_fmt(r['wall_s'], '.0f')} |"
        )
    lines.append("")
    lines.append("Bold: the paired 95% bootstrap interval excludes 0. Otherwise no difference at these seeds; the "
                 "smallest difference the seeds could detect (5% two-sided, 80% power):")  # fmt: skip
    for r in rows:
        d = r.get("final_reward_vs_none")
        if d is not None and d["verdict"] not in ("better", "worse"):
            lines.append(f"- {r['regime']} / {r['correction']}: {d['verdict']}")
    lines += ["", *_held_out_table(rows), "", *_position_table(runs)]
    for lag_set in LAG_SETS:
        if table := _lag_table(runs, lag_set):
            lines += ["", *table]
    m, stem = payload["machine"], payload.get("benchmark", NAME)  # is_study, or a copy such as the calibration
    lines.append(f"\n_{m['cpu']} ({m['cpu_count']} cores), torch {m['torch']}, commit {payload['commit'][:12]}._")
    text = "\n".join(lines)
    (out_dir / f"{stem}.md").write_text(text + "\n")
    _plot(runs, out_dir / f"{stem}.png")
    if any(r.get("positions") for r in runs):
        _position_plot(runs, out_dir / f"{stem}_positions.png")
    for lag_set, suffix in zip(LAG_SETS, ("lag", "lag_mb4"), strict=True):
        if any(r["regime"] == lag_set[-1] for r in runs):
            _lag_plot(runs, out_dir / f"{stem}_{suffix}.png", lag_set)
    return text


def _held_out_table(rows: list[dict]) -> list[str]:
    """The held-out score of the tasks that have one (SmolLM2: greedy exact match), paired like the reward."""
    rows = [r for r in rows if r["final_eval"] is not None]
    if not rows:
        return []
    lines = ["Held-out greedy exact match, before training and at the end, and the paired difference at the end.",
             "", "| regime | correction | seeds | before | end | vs none (95% CI) | vs tis (95% CI) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['regime']} | {r['correction']} | {r['seeds']} | {r['start_eval']:.3f} | {r['final_eval']:.3f} | "
            f"{_diff(r, 'final_eval_vs_none')} | {_diff(r, 'final_eval_vs_tis')} |"
        )
    return lines


def _position_table(runs: list[dict]) -> list[str]:
    """Where in the responses the drift is (is_pos/*, means over every run that logged them: each run
    evaluates every correction on its own tokens, whichever one trained)."""
    logged = [r for r in runs if r.get("positions")]
    if not logged:
        return []
    buckets = list(dict.fromkeys(k.rsplit("/", 1)[1] for r in logged for k in r["positions"] if "abs_log_ratio" in k))
    lines = ["Where in the responses (response positions; mean over the runs with IS on): mean |dlogp| and the "
             "fraction of the tokens there that each correction masks.", "",
             "| regime | positions | mean abs dlogp | " + " | ".join(CORRECTIONS[1:]) + " |",
             "|---|---|---|" + "---|" * (len(CORRECTIONS) - 1)]  # fmt: skip
    for regime in dict.fromkeys(r["regime"] for r in logged):
        sel = [r["positions"] for r in logged if r["regime"] == regime]

        def mean(key, sel=sel):
            return _position_mean(sel, key)

        for b in buckets:
            cells = [_fmt(mean(f"is_pos/masked/{c}/{b}"), ".2%") for c in CORRECTIONS[1:]]
            lines.append(
                f"| {regime} | {b} | {_fmt(mean(f'is_pos/abs_log_ratio/{b}'), '.3f')} | " + " | ".join(cells) + " |"
            )
    return lines


def _lag_table(runs: list[dict], lag_set: tuple[str, ...] = LAG_REGIMES) -> list[str]:
    """Adaptive staleness against the fixed queues it moves between: for every correction run adaptively, each
    regime of `lag_set` (fixed queues, then the adaptive one) at the adaptive runs' seeds, and the adaptive
    run's paired difference to each fixed queue."""
    adaptive = lag_set[-1]
    corrections = [c for c in CORRECTIONS if any((r["regime"], r["correction"]) == (adaptive, c) for r in runs)]
    if not corrections:
        return []
    lines = ["Adaptive staleness against fixed queues (same seeds): final reward, mean reward over the run (AUC), "
             "wall time of the run, and the adaptive run's paired difference to each fixed queue (95% CI).", "",
             "| correction | regime | seeds | final reward | AUC | wall s | staleness | lag | "
             "adaptive - this: final reward | adaptive - this: wall s |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for correction in corrections:
        seeds = set(by_seed(runs, adaptive, correction, "final_reward"))
        for regime in lag_set:
            cells = []
            for key in ("final_reward", "auc_reward", "wall_s", "mean_staleness"):
                values = [v for s, v in by_seed(runs, regime, correction, key).items() if s in seeds]
                cells.append(statistics.fmean(values) if values else None)
            if cells[0] is None:
                continue
            lags = [v for v in by_seed(runs, regime, correction, "mean_lag").values() if v is not None]
            lag = f"{statistics.fmean(lags):.2f}" if lags else f"{REGIMES[regime].flags['async_queue_size']} (fixed)"
            diffs = [_lag_diff(runs, correction, regime, key, seeds, adaptive) for key in ("final_reward", "wall_s")]
            n = len(by_seed(runs, regime, correction, "final_reward").keys() & seeds)
            lines.append(
                f"| {correction} | {regime} | {n} | {cells[0]:.3f} | {cells[1]:.3f} | {cells[2]:.0f} | "
                f"{_fmt(cells[3], '.2f')} | {lag} | {diffs[0]} | {diffs[1]} |"
            )
    return lines


def _lag_diff(runs: list[dict], correction: str, regime: str, key: str, seeds: set[int], adaptive_regime: str) -> str:
    """The adaptive regime's paired difference to `regime` in `key`, with its interval ('-' for itself)."""
    if regime == adaptive_regime:
        return "-"
    adaptive, fixed = (by_seed(runs, g, correction, key) for g in (adaptive_regime, regime))
    diffs = [adaptive[s] - fixed[s] for s in sorted(seeds) if s in fixed]
    if len(diffs) < 2:
        return "-"
    mean, low, high = paired_bootstrap(diffs)
    mark, spec = "**" if low > 0 or high < 0 else "", ".0f" if key == "wall_s" else ".3f"
    return f"{mark}{mean:+{spec}} [{low:+{spec}}, {high:+{spec}}]{mark}"


def elapsed(run: dict) -> list[float]:
    """Seconds into the run at the end of each step: the logged step times where the run kept them, else
    its wall time spread evenly over its steps (runs measured before step times were kept)."""
    if run.get("step_s"):
        return list(itertools.accumulate(run["step_s"]))
    return [run["wall_s"] * (i + 1) / len(run["rewards"]) for i in range(len(run["rewards"]))]


def _lag_plot(runs: list[dict], path: Path, lag_set: tuple[str, ...] = LAG_REGIMES, window: int = 10) -> None:
    """Reward (a `window`-step moving average, mean over seeds) against seconds of training, one panel per
    correction run adaptively, one line per regime of `lag_set`, at the adaptive runs' seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corrections = [c for c in CORRECTIONS if by_seed(runs, lag_set[-1], c, "final_reward")]
    fig, axes = plt.subplots(1, len(corrections), figsize=(4.5 * len(corrections), 3.2), squeeze=False)
    for ax, correction in zip(axes[0], corrections, strict=True):
        seeds = set(by_seed(runs, lag_set[-1], correction, "final_reward"))
        for regime in lag_set:
            sel = [r for r in runs if (r["regime"], r["correction"]) == (regime, correction) and r["seed"] in seeds]
            if not sel:
                continue
            n = min(len(r["rewards"]) for r in sel)
            times = [statistics.fmean(elapsed(r)[i] for r in sel) for i in range(window - 1, n)]
            moving = [statistics.fmean(statistics.fmean(r["rewards"][i - window + 1 : i + 1]) for r in sel)
                      for i in range(window - 1, n)]  # fmt: skip
            ax.plot(times, moving, label=regime, linewidth=1)
        ax.set_title(f"{correction} ({len(seeds)} seeds)")
        ax.set_xlabel("seconds of training")
    axes[0][0].set_ylabel(f"reward ({window}-step mean, mean over seeds)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot(runs: list[dict], path: Path) -> None:
    """Mean reward curve over seeds, one panel per regime, one line per correction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(dict.fromkeys(r["regime"] for r in runs))
    fig, axes = plt.subplots(1, len(regimes), figsize=(4.5 * len(regimes), 3.2), squeeze=False)
    for ax, regime in zip(axes[0], regimes, strict=True):
        for correction in CORRECTIONS:
            sel = [r for r in runs if (r["regime"], r["correction"]) == (regime, correction)]
            if sel:
                curves = [r["series"]["rollout/reward_mean"] for r in sel]
                n, every = min(map(len, curves)), sel[0]["series_step_every"]
                ax.plot([i * every for i in range(n)], [statistics.fmean(c[i] for c in curves) for i in range(n)],
                        label=correction, linewidth=1)  # fmt: skip
        seeds = len({r["seed"] for r in runs if r["regime"] == regime})
        ax.set_title(f"{regime} ({seeds} seed{'s' * (seeds > 1)})")
        ax.set_xlabel("step")
        ax.legend(fontsize=7)  # each panel: regimes need not share their corrections
    axes[0][0].set_ylabel("reward (mean over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _position_mean(positions: list[dict], key: str) -> float | None:
    """Mean of one is_pos/* value over the runs that logged it (None if none did)."""
    values = [p[key] for p in positions if p.get(key) is not None]
    return statistics.fmean(values) if values else None


def _position_plot(runs: list[dict], path: Path) -> None:
    """Where in the responses the drift is, per regime: the mean |dlogp| per response-position bucket and the
    fraction of the bucket's tokens each correction masks (top), and where each correction's first masked token
    of a sequence falls (bottom: the distribution over buckets). Means over the runs that logged is_pos/*."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logged = [r for r in runs if r.get("positions")]
    regimes = list(dict.fromkeys(r["regime"] for r in logged))
    buckets = list(dict.fromkeys(k.rsplit("/", 1)[1] for r in logged for k in r["positions"] if "abs_log_ratio" in k))
    masking = [c for c in CORRECTIONS[1:] if c != "tis"]  # tis truncates, it never masks
    fig, axes = plt.subplots(2, len(regimes), figsize=(4.5 * len(regimes), 6), squeeze=False)
    width = 0.8 / len(masking)
    for col, regime in enumerate(regimes):
        sel = [r["positions"] for r in logged if r["regime"] == regime]

        def mean(key, sel=sel):
            return _position_mean(sel, key) or 0.0

        top, bottom = axes[0][col], axes[1][col]
        for i, c in enumerate(masking):
            xs = [b + (i - (len(masking) - 1) / 2) * width for b in range(len(buckets))]
            top.bar(xs, [100 * mean(f"is_pos/masked/{c}/{b}") for b in buckets], width, label=c)
            # a step that masks no row logs 0 in every bucket: renormalise the mean over steps to a distribution
            first = [mean(f"is_pos/first_masked/{c}/{b}") for b in buckets]
            bottom.bar(xs, [100 * f / (sum(first) or 1) for f in first], width, label=c)
        drift = top.twinx()
        drift.plot(range(len(buckets)), [mean(f"is_pos/abs_log_ratio/{b}") for b in buckets], "k.-",
                   label="mean |dlogp|")  # fmt: skip
        drift.set_ylabel("mean |dlogp|" if col == len(regimes) - 1 else "")
        top.set_title(f"{regime} ({len(sel)} runs)")
        top.set_ylabel("% of the tokens masked" if col == 0 else "")
        bottom.set_ylabel("% of masked rows: first mask here" if col == 0 else "")
        for ax in (top, bottom):
            ax.set_xticks(range(len(buckets)), buckets)
        bottom.set_xlabel("response positions")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------ entry point
def run(args, study) -> None:
    config = {"tasks": TASKS, "regimes": {k: vars(v) for k, v in REGIMES.items()}, "corrections": CORRECTIONS}
    # after each run, atomically: a stop mid-write never loses the runs already measured
    save = lambda current: study.save(current, config)  # noqa: E731
    run_study(args.seeds, args.regimes, args.corrections, args.steps, study.stored(), save)


def options(p) -> None:
    p.add_argument("--regimes", nargs="+", choices=list(REGIMES), default=list(REGIMES))
    p.add_argument("--corrections", nargs="+", choices=CORRECTIONS, default=CORRECTIONS)


def main(argv=None) -> int:
    return study_main(argv, __doc__, NAME, run, render, options=options, seeds="1-8", steps=200)


if __name__ == "__main__":
    sys.exit(main())
