"""Which IS correction, when responses are long and the staleness is set: the screening and confirmatory study.

    python -m studies.is_long_study --seeds 101-103                      # a screening of every arm (hours)
    python -m studies.is_long_study --seeds 101 --regimes stale4 --corrections none reinforce_pro --steps 60
    python -m studies.is_long_study --plan confirmation --output DIR     # the registered stage, as registered
    python -m studies.is_long_study --render studies/results/is_long_screening.json

The task is the running sum of ten labelled digits (data/running_sum.py, ~60-token responses whose every step
the total depends on), on the built-in 2-layer model warm-started per seed. A regime sets the mismatch
exactly: `staleK` samples every step with the policy of exactly K steps before (`--rollout_staleness K`, a bf16
engine for an fp32 trainer); `partial` lets one response span several weight versions (partial rollouts in
chunks of 16 tokens, asynchronously); `stale2+partial` switches versions within each response as set
(synchronously: its first 16 tokens by the policy of 3 steps before, the rest by that of 2 before); `fp8` samples
from an FP8 engine, synchronously. `sync` is the undisturbed reference
(staleness 0, the same bf16 engine), run with no correction. Every correction of the family runs under every
other regime.

Pairing: per seed one warm start, one prompt order and one sampling seed shared by every arm (the engine is
reseeded before each run; the first step's rewards of the arms of a seed are equal). Each run evaluates the
held-out split greedily before training and at its last step (200 questions the warm start and RL never saw);
the primary endpoint is that last accuracy, the training reward (mean of the last 10 steps) is secondary.

Every run records its own commit, whether the tree was clean (a dirty tree refuses to run unless
`--allow-dirty`, and then records the diff's hash), the host id and its wall time. Results accumulate in one
JSON and the study resumes: a run already there (same seed, regime, correction, steps) is not run again. The
analysis (paired t-interval, t-test and Wilcoxon, Holm over each endpoint's family, TOST against a margin) is
studies/study_stats.py's; the confirmatory stage is registered in PLANS and on docs/results/is-long-study.md
before its runs, and writes its own file. A seed whose runs so far another host made from other weights is run
again whole.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import reinforce_pro  # noqa: F401  (before ray: keeps a local cluster on loopback, see ray_env.py)
from benchmarks.common import run_provenance, scratch_dir
from studies import RESULTS_DIR  # noqa: F401  (where its results are committed: the tests read them)
from studies.runner import UsageError, study_main
from studies.runs import held_out, summarise
from studies.study_stats import (
    collapse_kinds,
    detectable_at,
    detectable_difference,
    direction,
    holm,
    on_grid,
    paired_rate_test,
    paired_test,
    parse_seeds,
    seeds_needed,
    stored_results,
    tost,
    varies,
)

ROOT = Path(__file__).resolve().parent.parent

NAME = "is_long_screening"
TASK = "running_sum"
HELD_OUT = 200  # held-out questions evaluated greedily before training and at the last step
# regime -> the flags that set its mismatch (on top of the preset's bf16 engine for an fp32 trainer)
REGIMES = {
    "sync": {"rollout_staleness": 0},  # the undisturbed reference
    **{f"stale{k}": {"rollout_staleness": k} for k in (2, 4, 8)},  # every step samples with the policy of k before
    # one response spans several weight versions: a sync between chunks of 16 tokens, the producer up to 2 ahead
    "partial": {"async_train": True, "async_queue_size": 2, "partial_rollout": True, "partial_rollout_chunk": 16},
    "fp8": {"vllm_quantization": "fp8_per_channel"},  # synchronous, an FP8 engine (its own engine per seed)
    # synchronous partial rollouts: each response's first 16 tokens by the policy of 3 steps before, the rest by
    # that of 2 before (set, not left to timing as in `partial`)
    "stale2+partial": {"rollout_staleness": 2, "partial_rollout": True, "partial_rollout_chunk": 16},
    # mixture-of-experts plans only: stale4 with the trainer's forwards replaying the engine's experts (R3)
    "stale4+r3": {"rollout_staleness": 4, "routing_replay": "r3"},
}
MOE_ONLY = ("stale4+r3",)  # regimes a dense model cannot run (it has no routes to replay)
MOE_FLAGS = {"aux_loss_coef": 0.001}  # every run of a mixture-of-experts plan: the load-balancing loss on
CORRECTIONS = [
    "none", "tis", "icepop", "seq-mask-tis", "reinforce_pro", "reinforce_pro-tis", "minpro", "ctpo", "cppo",
    "dppo-tv", "kpop", "trm", "opsm", "geo-seq-mask", "token-tv", "token-binary-kl", "seq-tv", "seq-binary-kl",
    "reinforce_pro-tv", "reinforce_pro-sign", "reinforce_pro-pos", "dppo-ratio", "cppo-nosign", "cppo-flat",
]  # fmt: skip
ANCHORED = "+rollout"  # an arm's suffix: the correction under --vllm_is_anchor rollout (is_correction.py)
REFERENCES = ("none", "tis", "sync")  # every correction is compared with these (sync: the undisturbed `none`)
ENDPOINTS = {"final_eval": "held-out greedy accuracy at the last step", "final_reward": "training reward, last 10"}
# prefill tokens per engine step on CPU: the batch's 256 prompts (~5,600 tokens) in one step instead of 11 chunks of
# the engine's default 512, 62 engine steps a batch instead of 76 (benchmarks/bench_study_generate.py)
PREFILL_BUDGET = 8192
MARGIN = 0.03  # the screening's equivalence margin of the held-out accuracy (3 points) for TOST
DESIGN = "reinforce_pro"  # the correction compared head to head with every other of its regime
DELTA = 0.10  # the held-out difference a confirmation should detect (80% power): what the seed counts are for
STUDY_FLAGS = {"is_position_metrics": True, "eval_temperature": 0.0, "eval_n_samples_per_prompt": 1,
               "eval_before_training": True}  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """What one invocation runs and the numbers its analysis uses: a screening made of the flags given, or a
    confirmatory stage of PLANS, registered on docs/results/is-long-study.md before its runs; `--plan NAME` runs
    one exactly as registered (the command line cannot change any of it)."""

    name: str  # its JSON and table, apart from the screening's
    seeds: tuple[int, ...]  # a confirmation's: seeds no screening used
    regimes: tuple[str, ...]
    corrections: tuple[str, ...]  # NAME or NAME@LOW,HIGH, as --corrections takes them
    steps: int
    margin: float  # equivalence margin of the held-out accuracy, for TOST
    model: str = "dense"  # the built-in model: dense, or moe (its mixture-of-experts twin, models/tiny.py)


# The confirmation's arms, by the screening's rule: the references, reinforce_pro at its default band and at the
# band where its mask fires, OpenRLHF's built-in masks, and the rivals that held at every screening seed and
# ended within 0.10 of the best stale arm.
CONFIRMATION_ARMS = ("none", "tis", "icepop", "seq-mask-tis", "reinforce_pro", "reinforce_pro@0.9,1.1", "cppo",
                     "dppo-tv", "minpro")  # fmt: skip
PLANS: dict[str, Plan] = {
    # Registered on docs/results/is-long-study.md ("Registered plan: the confirmation") before any of its runs.
    # 16 seeds: the screening's paired sd between arms that both hold is at most 0.065.
    "confirmation": Plan(
        name="is_long_confirmation",
        seeds=tuple(range(301, 317)),
        regimes=("sync", "stale4"),
        corrections=CONFIRMATION_ARMS,
        steps=100,
        margin=0.05,
    ),
    # Registered on docs/results/is-long-study.md ("Registered plan: the second confirmation") before any of its
    # runs, with the regime and arms studies/confirmation_rule.py picked from both screenings as committed. 24 seeds:
    # the first confirmation's paired sd between a collapsing and a holding arm was 0.15-0.21.
    "second_confirmation": Plan(
        name="is_second_confirmation",
        seeds=tuple(range(601, 625)),
        regimes=("sync", "fp8"),
        corrections=("none", "reinforce_pro", "reinforce_pro+rollout", "cppo", "dppo-tv"),
        steps=100,
        margin=0.03,
    ),
    # Registered on docs/results/moe-routing.md ("Registered plan: the MoE screening") before any of its runs.
    # A screening (3 seeds): which of replay and the corrections holds an MoE run whose routes drift 4 versions.
    "moe_screening": Plan(
        name="moe_screening",
        seeds=(701, 702, 703),
        regimes=("sync", "stale4", "stale4+r3"),
        corrections=("none", "tis", "reinforce_pro", "reinforce_pro@0.9,1.1", "cppo", "dppo-tv"),
        steps=100,
        margin=0.03,
        model="moe",
    ),
    # Registered on docs/results/moe-routing.md ("Registered plan: the MoE confirmation") before any of its runs,
    # by the screening's own rule: replay against no replay for the correction whose replay difference was
    # largest (tis, -0.113, paired sd 0.054). Both arms collapsed at every screening seed, so the test is rank-based
    # (exact sign-flip): 8 seeds make its smallest two-sided p 2/256.
    "moe_confirmation": Plan(
        name="moe_confirmation",
        seeds=tuple(range(711, 719)),
        regimes=("stale4", "stale4+r3"),
        corrections=("tis",),
        steps=100,
        margin=0.03,
        model="moe",
    ),
}


def arms(regimes: list[str], corrections: list[str]) -> list[tuple[str, str]]:
    """(regime, correction) of every run a seed needs: `sync` with `none` only, every other regime with all."""
    out = [("sync", "none")] if "sync" in regimes else []
    return out + [(g, c) for g in regimes if g != "sync" for c in corrections]


def missing_arms(runs: list[dict], seeds, arm_list, steps: int) -> dict[int, list[tuple[str, str]]]:
    """Per seed, the arms of `arm_list` that `runs` does not yet hold at `steps`: what a resumed study runs."""
    have = {(r["seed"], r["regime"], r["correction"], r["steps"]) for r in runs}
    return {s: [a for a in arm_list if (s, *a, steps) not in have] for s in seeds}


def warm_start(
    seed: int, workdir: Path, code: dict, cache: Path | None = None, model: str = "dense"
) -> tuple[str, dict]:
    """The starting model of every run of `seed`: what train_ppo_ray's --builtin_task running_sum warm-starts
    (with `model` moe, what it warm-starts under --embedded_model moe).
    `code`: the study's provenance (its host and the commit of the code it loaded). With `cache`, the warm start
    an earlier invocation made on this host with the same settings is reused (a study resumed mid-seed saves its
    3-5 minutes; the runs record the commit that made it)."""
    from reinforce_pro.cli.presets import EMBEDDED_RUNNING_SUM, RUNNING_SUM_WARMUP
    from reinforce_pro.data import EMBEDDED_TASKS
    from reinforce_pro.models.tiny import build_tiny_model, build_tiny_moe_model
    from reinforce_pro.trainer.sft_warmup import embedded_warm_start

    layers, max_new = EMBEDDED_TASKS[TASK]().model_layers, EMBEDDED_RUNNING_SUM["max_new_tokens"]
    key = {"task": TASK, "seed": seed, "layers": layers, "max_new_tokens": max_new, "host_id": code["host_id"],
           **RUNNING_SUM_WARMUP, **({"model": model} if model != "dense" else {})}  # fmt: skip
    out = (cache or workdir) / (f"warm_{seed}" if model == "dense" else f"warm_{model}_{seed}")
    stamp = out / "warm_start.json"  # written last: a warm start cut short has none and is made again
    if stamp.exists() and (made := json.loads(stamp.read_text()))["key"] == key:
        print(f"[is_long_study] seed {seed}: the kept warm start ({made['stats']['sft/steps']} steps)", flush=True)
        return str(out), {**made["stats"], "commit": made["commit"], "sha256": weights_digest(out)}
    shutil.rmtree(out, ignore_errors=True)
    build = build_tiny_moe_model if model == "moe" else build_tiny_model
    base = build(
        workdir / (f"base_{seed}" if model == "dense" else f"base_{model}_{seed}"), seed=seed, num_layers=layers
    )
    steps, target = RUNNING_SUM_WARMUP["sft_warmup_steps"], RUNNING_SUM_WARMUP["sft_warmup_target"]
    stats = embedded_warm_start(TASK, base, out, steps, seed, target, max_new)
    stamp.write_text(json.dumps({"key": key, "stats": stats, "commit": code["commit"]}) + "\n")
    print(f"[is_long_study] seed {seed}: warm start of {stats['sft/steps']} steps", flush=True)
    return str(out), {**stats, "commit": code["commit"], "sha256": weights_digest(out)}


def weights_digest(model_dir: Path) -> str:
    """A short hash of a saved model's weights: two runs of a seed made in different sessions (each remaking the
    warm start) are paired only if their warm starts are the same weights, which the steps alone do not show."""
    import hashlib

    return hashlib.sha256((Path(model_dir) / "model.safetensors").read_bytes()).hexdigest()[:16]


def correction_arm(text: str) -> str:
    """A correction of CORRECTIONS at its band, or at another: NAME@LOW,HIGH (e.g. reinforce_pro@0.9,1.1, a
    strength the screening tries), either with the suffix +rollout for the rollout anchor (reinforce_pro+rollout);
    the argparse type of --corrections."""
    name = text.removesuffix(ANCHORED).partition("@")[0]
    try:
        band = split_arm(text)[1]
    except ValueError:
        band = ()  # not numbers: refused below as a malformed band
    if name not in CORRECTIONS or (name == "none" and text != name):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a correction of {', '.join(CORRECTIONS)}, or NAME@LOW,HIGH, either with {ANCHORED}"
        )
    if band is not None and len(band) != 2:
        raise argparse.ArgumentTypeError(f"{text!r}: the band is LOW,HIGH, e.g. {name}@0.9,1.1")
    if band is not None and not 0 <= band[0] < band[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: the band must satisfy 0 <= LOW < HIGH")
    return text


def arm_order(correction: str) -> tuple[int, str]:
    """Where an arm sorts in a table: by its correction's place in CORRECTIONS, an arm at another band after it."""
    return CORRECTIONS.index(split_arm(correction)[0]), correction


def split_arm(correction: str) -> tuple[str, tuple[float, float] | None]:
    """NAME@LOW,HIGH -> (NAME, (LOW, HIGH)); a plain name -> (name, None); the anchor's suffix dropped."""
    name, _, band = correction.removesuffix(ANCHORED).partition("@")
    return name, (tuple(float(v) for v in band.split(",")) if band else None)


def arm_anchor(correction: str) -> str:
    """The arm's --vllm_is_anchor: `rollout` for NAME...+rollout, else the default `old`."""
    return "rollout" if correction.endswith(ANCHORED) else "old"


def with_correction(cfg, correction: str, save: Path):
    """`cfg` with one IS correction (`none`: IS off) at its band (a divergence gate's own [0, HIGH]) or the
    arm's own (NAME@LOW,HIGH), under the arm's anchor, writing to `save`."""
    from reinforce_pro.algos.is_correction import default_band

    name, band = split_arm(correction)
    surrogate = replace(cfg.loss.surrogate, enable_vllm_is_correction=name != "none")
    if name != "none":
        band = band or default_band(name, tuple(surrogate.vllm_is_truncated_threshold))
        surrogate = replace(surrogate, vllm_is_correction_type=name, vllm_is_truncated_threshold=band,
                            vllm_is_anchor=arm_anchor(correction))  # fmt: skip
    return replace(cfg, loss=replace(cfg.loss, surrogate=surrogate), output=replace(cfg.output, save_path=str(save)))


def held_out_file(workdir: Path) -> Path:
    """The held-out split as an --eval_dataset (the same 200 questions for every seed and arm)."""
    from reinforce_pro.data import running_sum

    path = workdir / "eval.jsonl"  # its stem names the metrics: eval/eval/pass@1 (runs.EVAL_KEY)
    path.write_text("".join(json.dumps(r) + "\n" for r in running_sum.records(HELD_OUT, 1234, "held_out")))
    return path


def run_config(model: str, seed: int, steps: int, regime: dict, eval_path: Path, moe: bool = False):
    """The embedded-running-sum preset for `model`, with the regime's flags and the held-out evaluations; `moe`:
    the model is mixture-of-experts (MOE_FLAGS on, its engine records every token's experts)."""
    from reinforce_pro.cli.flags_to_config import run_config as build
    from reinforce_pro.cli.presets import EMBEDDED_RUNNING_SUM
    from reinforce_pro.cli.train_ppo_ray import parse_args

    args = parse_args(["--pretrain", model])
    vars(args).update({k: v for k, v in EMBEDDED_RUNNING_SUM.items() if k != "vllm_is_correction_type"})
    vars(args).update(STUDY_FLAGS, seed=seed, max_samples=32 * steps, builtin_task=TASK, eval_dataset=str(eval_path),
                      eval_steps=steps, **regime, **(MOE_FLAGS if moe else {}))  # fmt: skip
    cfg = build(args)  # the engine is started before the run, so its settings name the model here
    engine = replace(cfg.engines.config, model_path=model, cpu_max_batched_tokens=PREFILL_BUDGET, capture_routes=moe)
    return replace(cfg, engines=replace(cfg.engines, config=engine))


def run_study(
    seeds,
    regimes,
    corrections,
    steps,
    runs: list[dict],
    save,
    code: dict,
    cache=None,
    pictures: Path | None = None,
    model: str = "dense",
) -> list[dict]:
    """Run every (seed, regime, correction) not yet in `runs`, one Ray cluster and one engine per seed;
    `save(runs)` after each run. `code`: the provenance of the tree when the study started, the code its runs
    execute (a commit made while it runs changes the tree, not the loaded code); `cache`: warm starts kept
    between invocations; `pictures`: where each run's drift picture is kept (<seed>_<regime>_<correction>.png)."""
    import ray

    from reinforce_pro.rollout.vllm_engine import VLLMEngine
    from reinforce_pro.run.driver import build_and_fit
    from reinforce_pro.run.prepare import prepare
    from reinforce_pro.workers.launcher import start_ray

    todo = missing_arms(runs, seeds, arms(regimes, corrections), steps)
    total, count = sum(map(len, todo.values())), 0
    if not total:
        return runs
    with scratch_dir("is_long_study_") as workdir:  # a run cut short keeps its logs and checkpoints there
        eval_path = held_out_file(workdir)
        workers_import(ROOT)
        start_ray(logical_cpus=8)
        for seed, pending in ((s, p) for s, p in todo.items() if p):
            start, warm = warm_start(seed, workdir, code, cache, model)
            configs = {g: run_config(start, seed, steps, REGIMES[g], eval_path, model == "moe")
                       for g in {g for g, _ in pending}}  # fmt: skip
            engines = {}  # quantization -> the engine its runs share (the regimes differ in no other engine setting)
            for regime, correction in pending:
                count += 1
                print(f"[is_long_study] {count}/{total}: seed {seed} {regime} {correction}", flush=True)
                cfg = with_correction(configs[regime], correction, workdir / f"{seed}_{regime}_{correction}")
                setting = cfg.engines.config
                if setting.quantization not in engines:
                    engines[setting.quantization] = ray.remote(VLLMEngine).options(num_cpus=1).remote(setting)
                engine = engines[setting.quantization]
                ray.get(engine.reseed.remote(seed))  # paired: every arm of a seed samples its first batch alike
                provenance, began = {**code, "started": run_provenance()["started"]}, time.perf_counter()
                plan = prepare(cfg)
                history = build_and_fit(cfg, plan, engines=[engine])
                record = {"seed": seed, "regime": regime, "correction": correction, "steps": steps,
                          "regime_flags": REGIMES[regime], "warm_start_steps": warm["sft/steps"],
                          "warm_start_commit": warm["commit"], "warm_start_sha256": warm["sha256"],
                          **({"model": model} if model != "dense" else {}), **provenance}  # fmt: skip
                runs.append({**record, **summarise(history, time.perf_counter() - began, held_out(plan.run_dir)),
                             **lengths(history), **routing(history)})  # fmt: skip
                save(runs)
                if pictures is not None and (plan.run_dir / "drift.png").is_file():
                    pictures.mkdir(parents=True, exist_ok=True)
                    shutil.copy(plan.run_dir / "drift.png", pictures / f"{seed}_{regime}_{correction}.png")
            for engine in engines.values():
                ray.kill(engine)
    return runs


def set_aside_other_hosts(
    runs: list[dict], seeds, arm_list, steps: int, host: str, weights: Callable[[int], str] | None = None
) -> tuple[list[dict], list[dict]]:
    """(kept, set aside): a seed with arms of `arm_list` still to run, whose runs of those arms another host made,
    has them run again whole on this one. They pair only with runs from the same weights, and a warm start made on
    another machine need not be the same model; `weights(seed)`, the hash of this host's warm start of the seed,
    keeps the other host's runs where every one of them records that hash. Runs of other arms (another
    invocation's regime) and complete seeds stay where they ran; the file keeps the set-aside runs apart."""
    incomplete = {s for s, missing in missing_arms(runs, seeds, arm_list, steps).items() if missing}
    wanted = set(arm_list)
    ours = [r for r in runs if r["seed"] in incomplete and (r["regime"], r["correction"]) in wanted]
    elsewhere = {r["seed"] for r in ours if r["host_id"] != host}

    def same_weights(seed: int) -> bool:
        hashes = {r.get("warm_start_sha256") for r in ours if r["seed"] == seed}
        return weights is not None and hashes == {weights(seed)}

    moved = {s for s in elsewhere if not same_weights(s)}
    gone = {id(r) for r in ours if r["seed"] in moved}
    return [r for r in runs if id(r) not in gone], [r for r in runs if id(r) in gone]


def workers_import(root: Path) -> None:
    """Ray's workers (the engine, the policy) import reinforce_pro from `root`, the tree whose commit the runs
    record: they inherit the environment of the cluster this process starts, and an editable install would
    otherwise give them the checkout it was installed from (a study run from a clone pinned at a registered
    commit would run the other checkout's code)."""
    paths = [str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


def routing(history: list[dict]) -> dict:
    """An MoE run's routing drift, each routing/* and routing_pos/* metric's mean over its steps (docs/metrics.md);
    nothing for a dense run."""
    keys = sorted({k for h in history for k in h if k.startswith(("routing/", "routing_pos/"))})
    return {"routing": {k: statistics.fmean(h[k] for h in history if k in h) for k in keys}} if keys else {}


def lengths(history: list[dict]) -> dict:
    """The run's mean response length (tokens, <eos> included) and the staleness its trained tokens had."""
    mean = lambda key: statistics.fmean(h[key] for h in history if key in h) if any(key in h for h in history) else None  # noqa: E731
    return {"response_length": mean("rollout/response_length_mean"), "staleness_trained": mean("async/staleness_mean")}


# ------------------------------------------------------------------------------------------ analysis
ACCURACIES = ("final_eval", "start_eval")  # held-out accuracies: multiples of 1/HELD_OUT, compared on that grid


def values(runs: list[dict], regime: str, correction: str, key: str) -> dict[int, float]:
    """Per seed, `key` of the arm's runs; a held-out accuracy on its grid (study_stats.on_grid)."""
    exact = on_grid if key in ACCURACIES else lambda v, _: v
    return {r["seed"]: exact(r[key], HELD_OUT) for r in runs
            if (r["regime"], r["correction"]) == (regime, correction) and r.get(key) is not None}  # fmt: skip


def compare(runs: list[dict], regime: str, correction: str, reference: str, key: str, margin: float) -> dict | None:
    """The paired comparison of `correction` with a reference in `regime` (`sync`: the sync regime's `none`;
    any other name: that correction of `regime`), with TOST within ±`margin` on the primary endpoint."""
    ref_regime, ref_correction = ("sync", "none") if reference == "sync" else (regime, reference)
    if (regime, correction) == (ref_regime, ref_correction):
        return None
    a, b = values(runs, regime, correction, key), values(runs, ref_regime, ref_correction, key)
    diffs = [a[s] - b[s] for s in sorted(a) if s in b]
    if len(diffs) < 2:
        return None
    test, side = paired_test(diffs), direction(diffs)
    out = {"n": test.n, "mean": test.mean, "low": test.low, "high": test.high, "sd": test.sd, "p_t": test.p_t,
           "p_wilcoxon": test.p_wilcoxon, "detectable": detectable_difference(diffs), "diffs": diffs,
           "lower": side.lower, "higher": side.higher, "ties": side.ties, "p_sign": side.p_sign,
           "p_sign_flip": side.p_sign_flip}  # fmt: skip
    if key == "final_eval" and test.sd > 0:
        out["p_tost"] = tost(diffs, margin)
    return out


def analyse(runs: list[dict], margin: float = MARGIN) -> list[dict]:
    """One row per regime x correction: means, collapses by kind, and the comparisons with every reference,
    their t-test p-values Holm-adjusted over each endpoint's family (every comparison of that endpoint)."""
    rows = []
    for regime in (g for g in REGIMES if any(r["regime"] == g for r in runs)):
        present = {r["correction"] for r in runs if r["regime"] == regime}
        for correction in sorted(present, key=arm_order):
            sel = [r for r in runs if (r["regime"], r["correction"]) == (regime, correction)]
            kinds = [k for r in sel for k in collapse_kinds(r["rewards"], r["grad_norms"])]
            row = {"regime": regime, "correction": correction, "seeds": len(sel),
                   "collapses": {k: kinds.count(k) for k in ("reward", "grad_norm")}}  # fmt: skip
            for key in ("final_eval", "start_eval", "final_reward", "masked_frac", "response_length",
                        "staleness_trained", "versions_per_row", "mixed_rows", "mean_abs_log_ratio",
                        "wall_s"):  # fmt: skip
                found = [r[key] for r in sel if r.get(key) is not None]
                row[key] = statistics.fmean(found) if found else None
            for key in ENDPOINTS:
                for ref in REFERENCES:
                    row[f"{key}_vs_{ref}"] = compare(runs, regime, correction, ref, key, margin)
            rows.append(row)
    for key in ENDPOINTS:  # Holm over the family of one endpoint
        tests = [(row, ref) for row in rows for ref in REFERENCES if row[f"{key}_vs_{ref}"]]
        for (row, ref), p in zip(tests, holm([row[f"{key}_vs_{ref}"]["p_t"] for row, ref in tests]), strict=True):
            row[f"{key}_vs_{ref}"]["p_holm"] = p
    return rows


def head_to_head(runs: list[dict], margin: float, design: str = DESIGN) -> list[dict]:
    """`design` against every other correction of each regime it ran in, paired by seed on the primary endpoint:
    the family of "is the prefix design better, worse or equivalent". The t-tests are Holm-adjusted over this
    family, and so, apart, are the TOSTs (each equivalence is a claim of its own)."""
    rows = []
    for regime in (g for g in REGIMES if g != "sync"):
        others = sorted({r["correction"] for r in runs if r["regime"] == regime} - {design}, key=arm_order)
        for other in others:
            test = compare(runs, regime, design, other, "final_eval", margin)
            if test is not None:
                rows.append({"regime": regime, "design": design, "other": other, **test})
    for row, p in zip(rows, holm([row["p_t"] for row in rows]), strict=True):
        row["p_holm"] = p
    with_tost = [row for row in rows if "p_tost" in row]
    for row, p in zip(with_tost, holm([row["p_tost"] for row in with_tost]), strict=True):
        row["p_tost_holm"] = p
    for row in rows:
        row["verdict"] = verdict(row, margin)
        # seeds for a paired test with 80% power to detect DELTA at the family's Bonferroni level (Holm's worst case)
        row["seeds_for_delta"] = seeds_needed(row["sd"], DELTA, alpha=0.05 / len(rows)) if row["sd"] > 0 else None
        row["detectable_family"] = detectable_at(row["diffs"], alpha=0.05 / len(rows))
        row.update(collapse_rates(runs, row["regime"], row["design"], row["other"]))
    return rows


def collapse_rates(runs: list[dict], regime: str, a: str, b: str, regimes: tuple[str, str] | None = None) -> dict:
    """How many of the paired seeds collapsed (a reward collapse or a gradient-norm flag) under `a` and under `b`
    in `regime` (or `a` in regimes[0] and `b` in regimes[1]), and the exact McNemar test of the difference."""
    sides = list(zip(regimes or (regime, regime), (a, b), strict=True))
    seeds = [{r["seed"]: bool(collapse_kinds(r["rewards"], r["grad_norms"])) for r in runs
              if (r["regime"], r["correction"]) == side} for side in sides]  # fmt: skip
    paired = sorted(set(seeds[0]) & set(seeds[1]))
    x, y = [seeds[0][s] for s in paired], [seeds[1][s] for s in paired]
    return {"collapsed_design": sum(x), "collapsed_other": sum(y), "p_collapse": paired_rate_test(x, y)}


# The mechanism screening's comparisons: (variant, parent, the one ingredient the variant moves); algos/is_mechanisms.py
MECHANISM_PAIRS = (
    ("reinforce_pro-tis", "reinforce_pro", "+ a truncated weight"),
    ("reinforce_pro+rollout", "reinforce_pro", "+ the rollout anchor"),
    ("reinforce_pro-tv", "reinforce_pro", "+ a probability-space prefix gate"),
    ("reinforce_pro-sign", "reinforce_pro", "+ DPPO's advantage-sign rule"),
    ("reinforce_pro-pos", "reinforce_pro", "+ CPPO's position weights"),
    ("token-tv", "dppo-tv", "- DPPO's advantage sign"),
    ("dppo-ratio", "dppo-tv", "- DPPO's probability space (a ratio band)"),
    ("dppo-ratio", "icepop", "+ DPPO's sign on icepop's ratio band"),
    ("cppo-nosign", "cppo", "- CPPO's exemption of tokens moving toward mu"),
    ("cppo-flat", "cppo", "- CPPO's position weights"),
)


def mechanisms(runs: list[dict], regime: str = "stale4") -> list[dict]:
    """Per MECHANISM_PAIRS entry whose two arms share a seed in `regime`: the held-out accuracy of each, the
    paired differences seed by seed, and how many seeds collapsed under each."""
    rows = []
    for variant, parent, ingredient in MECHANISM_PAIRS:
        a, b = (values(runs, regime, c, "final_eval") for c in (variant, parent))
        seeds = sorted(set(a) & set(b))
        if not seeds:
            continue
        diffs = [a[s] - b[s] for s in seeds]
        masked = [statistics.fmean(values(runs, regime, c, "masked_frac").get(s) or 0.0 for s in seeds)
                  for c in (variant, parent)]  # fmt: skip
        rows.append({"variant": variant, "parent": parent, "ingredient": ingredient, "seeds": seeds,
                     "variant_eval": statistics.fmean(a[s] for s in seeds),
                     "parent_eval": statistics.fmean(b[s] for s in seeds), "diffs": diffs,
                     "lower": sum(d < 0 for d in diffs), "higher": sum(d > 0 for d in diffs),
                     "masked": masked, **collapse_rates(runs, regime, variant, parent)})  # fmt: skip
    return rows


def replay_effect(
    runs: list[dict], margin: float = 0.03, off: str = "stale4", replayed: str = "stale4+r3"
) -> list[dict]:
    """Per correction run in both `off` and `replayed` (the same drift, the trainer replaying the engine's experts
    or routing itself): the held-out accuracy of each, the paired difference replayed - off seed by seed with the
    exact sign-flip test (Holm over the corrections), the Wilcoxon signed-rank test beside it, TOST within
    ±`margin`, the collapses under each (exact McNemar) and the routing drift and masked fraction under each."""
    rows = []
    both = {r["correction"] for r in runs if r["regime"] == off} & {
        r["correction"] for r in runs if r["regime"] == replayed
    }
    for correction in sorted(both, key=arm_order):
        a, b = (values(runs, g, correction, "final_eval") for g in (replayed, off))
        seeds = sorted(set(a) & set(b))
        if not seeds:
            continue
        diffs = [a[s] - b[s] for s in seeds]
        side = direction(diffs)
        arm = {g: [r for r in runs if (r["regime"], r["correction"]) == (g, correction)] for g in (off, replayed)}
        flips = {g: _mean([r.get("routing", {}).get("routing/flip_frac") for r in arm[g]]) for g in arm}
        masked = {g: _mean([r.get("masked_frac") for r in arm[g]]) for g in arm}
        rows.append({"correction": correction, "n": len(seeds), "off": statistics.fmean(b[s] for s in seeds),
                     "replayed": statistics.fmean(a[s] for s in seeds), "diffs": diffs, "lower": side.lower,
                     "p_wilcoxon": paired_test(diffs).p_wilcoxon if len(diffs) > 1 else None,
                     "p_tost": tost(diffs, margin) if varies(diffs) else None, "margin": margin,
                     "higher": side.higher, "p_sign_flip": side.p_sign_flip, "flip_off": flips[off],
                     "flip_replayed": flips[replayed], "masked_off": masked[off],
                     "masked_replayed": masked[replayed],
                     **collapse_rates(runs, off, correction, correction, (replayed, off))})  # fmt: skip
    for row, p in zip(rows, holm([r["p_sign_flip"] for r in rows]), strict=True):
        row["p_sign_flip_holm"] = p
    return rows


def _mean(found: list) -> float | None:
    found = [v for v in found if v is not None]
    return statistics.fmean(found) if found else None


def render_replay(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ["", "Routing replay (`stale4+r3` - `stale4`, the same arm with the trainer replaying the engine's experts "
             "or routing itself), held-out accuracy at the last step paired by seed; exact sign-flip p Holm-adjusted "
             "over the corrections, the Wilcoxon signed-rank p beside it, TOST within ±margin (small: equivalent); "
             "collapses with the exact McNemar p; routing flips: (token, MoE layer) pairs whose top-k set differs "
             "between engine and trainer, measured before replay:", "",
             "| correction | seeds | off -> r3 | r3 - off by seed | lower / higher | sign-flip p (Holm) | Wilcoxon p "
             "| TOST p | collapsed (off / r3), McNemar p | routing flips (off / r3) | masked (off / r3) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        by_seed = ", ".join(f"{d:+.3f}" for d in r["diffs"])
        lines.append(f"| {r['correction']} | {r['n']} | {r['off']:.3f} -> {r['replayed']:.3f} | {by_seed} | "
                     f"{r['lower']} / {r['higher']} | {r['p_sign_flip_holm']:.3f} | {_fmt(r['p_wilcoxon'], '.3f')} | "
                     f"{_fmt(r['p_tost'], '.3f')} (±{r['margin']}) | {r['collapsed_other']} / {r['collapsed_design']}"
                     f", {r['p_collapse']:.3f} | {_fmt(r['flip_off'], '.2%')} / {_fmt(r['flip_replayed'], '.2%')} | "
                     f"{_fmt(r['masked_off'], '.2%')} / {_fmt(r['masked_replayed'], '.2%')} |")  # fmt: skip
    return lines


def render_mechanisms(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ["", "Mechanisms (exploratory, stale4): each variant against the correction it moves one ingredient of "
             "(algos/is_mechanisms.py), held-out accuracy at the last step, paired by seed:", "",
             "| ingredient | variant - parent | seeds | held-out variant / parent | difference by seed | lower / "
             "higher | masked variant / parent | seeds collapsed variant / parent |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        by_seed = ", ".join(f"{d:+.3f}" for d in r["diffs"])
        lines.append(f"| {r['ingredient']} | {r['variant']} - {r['parent']} | {len(r['seeds'])} | "
                     f"{r['variant_eval']:.3f} / {r['parent_eval']:.3f} | {by_seed} | {r['lower']} / {r['higher']} | "
                     f"{r['masked'][0]:.2%} / {r['masked'][1]:.2%} | "
                     f"{r['collapsed_design']} / {r['collapsed_other']} |")  # fmt: skip
    return lines


def render_by_seed(runs: list[dict]) -> list[str]:
    """Every arm's held-out accuracy at its last step, seed by seed, a collapsed run marked: what a screening
    reports before any test (and what a reader checks a mean against)."""
    seeds = sorted({r["seed"] for r in runs})
    if len(seeds) < 2:
        return []
    cells: dict[tuple[str, str], dict[int, str]] = {}
    for r in runs:
        mark = " (c)" if collapse_kinds(r["rewards"], r["grad_norms"]) else ""
        cells.setdefault((r["regime"], r["correction"]), {})[r["seed"]] = f"{r['final_eval']:.3f}{mark}"
    order = sorted(cells, key=lambda k: (list(REGIMES).index(k[0]), arm_order(k[1])))
    lines = ["", "Seed by seed: held-out accuracy at the last step ((c): the run collapsed, by "
             "study_stats.collapse_kinds)",
             "", f"| regime | correction | {' | '.join(f'seed {s}' for s in seeds)} |",
             f"|---|---|{'---|' * len(seeds)}"]  # fmt: skip
    for regime, correction in order:
        by_seed = cells[(regime, correction)]
        lines.append(f"| {regime} | {correction} | {' | '.join(by_seed.get(s, '-') for s in seeds)} |")
    return lines


def verdict(d: dict, margin: float) -> str:
    """What a Holm-adjusted comparison establishes: better, worse, equivalent within the margin, or not
    established (with the smallest difference these seeds could have detected)."""
    if d["p_holm"] is not None and d["p_holm"] < 0.05:
        return "better" if d["mean"] > 0 else "worse"
    if d.get("p_tost_holm", 1.0) < 0.05:
        return f"equivalent within ±{margin}"
    return f"not established (detectable: {d['detectable']:.2f})"


def _cell(d: dict | None) -> str:
    if d is None:
        return "-"
    if d["p_holm"] is None:  # every seed differs by the same amount: no t-test (study_stats.paired_test)
        return f"{d['mean']:+.3f} at every seed, no spread"
    mark = "**" if d["p_holm"] < 0.05 else ""
    return f"{mark}{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] p={d['p_holm']:.2f}{mark}"


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_head_to_head(rows: list[dict], margin: float) -> list[str]:
    """The head-to-head family as a table, with the seeds a confirmation of each difference would need."""
    if not rows:
        return []
    lines = ["", f"`{rows[0]['design']}` against each other correction, paired over seeds (held-out accuracy at "
             "the last step; t-test and TOST each Holm-adjusted over this family; Wilcoxon beside them):", "",
             f"| regime | {rows[0]['design']} - | seeds | mean [95% t-interval] | p (t, Holm) | p (Wilcoxon) | "
             f"TOST ±{margin} (Holm) | verdict | sd of differences | seeds to detect {DELTA} |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['regime']} | {r['other']} | {r['n']} | {r['mean']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] | "
            f"{_fmt(r['p_holm'], '.3f')} | {_fmt(r['p_wilcoxon'], '.3f')} | {_fmt(r.get('p_tost_holm'), '.3f')} | "
            f"{r['verdict']} | {r['sd']:.3f} | {_fmt(r['seeds_for_delta'], 'd')} |"
        )
    lines.append(f"\nSeeds to detect {DELTA}: a paired t-test with 80% power to detect a difference of {DELTA} at "
                 f"the family's Bonferroni level (0.05 / {len(rows)}), given the sd of the differences above. "
                 "Detectable: the smallest difference these seeds could have detected (5%, 80% power).")  # fmt: skip
    return lines + render_direction(rows)


def render_direction(rows: list[dict]) -> list[str]:
    """The same family seed by seed (exploratory, beside whatever a plan registered): how many seeds fall on each
    side, the exact sign and sign-flip tests (which hold where collapses make the differences heavy-tailed), the
    smallest difference the family's level lets these seeds detect, and the seeds that collapsed under each."""
    design = rows[0]["design"]
    lines = ["", f"Seed by seed (exploratory: not a registered test): where `{design}` lands against each arm, the "
             "exact two-sided sign test over untied seeds and the exact sign-flip permutation test of the mean "
             "difference, unadjusted; and the smallest difference a paired t-test at the family's level "
             f"(0.05 / {len(rows)}, 80% power) detects at these seeds; the seeds with a reward collapse or a "
             "gradient-norm flag under each arm and the exact McNemar test of the two rates.", "",
             f"| regime | {design} - | lower / higher / tied | sign test p | sign-flip p | detectable at 0.05 / "
             f"{len(rows)} | seeds collapsed ({design} / other) | exact McNemar p |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['regime']} | {r['other']} | {r['lower']} / {r['higher']} / {r['ties']} | "
                     f"{r['p_sign']:.4f} | {r['p_sign_flip']:.4f} | {r['detectable_family']:.2f} | "
                     f"{r['collapsed_design']} / {r['collapsed_other']} | {r['p_collapse']:.3f} |")  # fmt: skip
    return lines


def progress(runs: list[dict], plan: dict | None) -> list[str]:
    """A registered plan's file rendered before its last run: how far it is, and that it allows no verdict yet."""
    if not plan:
        return []
    expected = arms(list(plan["regimes"]), list(plan["corrections"]))
    missing = missing_arms(runs, plan["seeds"], expected, plan["steps"])
    left, total = sum(map(len, missing.values())), len(plan["seeds"]) * len(expected)
    if not left:
        return []
    complete = sum(not m for m in missing.values())
    head = f"**Partial: {total - left} of {total} runs, {complete} of {len(plan['seeds'])} seeds complete."
    return [f"{head} The registered plan allows no verdict before every seed has run: the tests below are not "
            "findings.**", ""]  # fmt: skip


def sampling(run: dict) -> tuple:
    """How a run samples its first batch from the warm start: its engine, and whether it samples responses in
    chunks (partial rollouts) and ahead of the trainer (asynchronously). Arms that sample alike draw the same first
    batch; a chunked or asynchronous regime draws its own from the same weights."""
    flags = run.get("regime_flags") or {}
    return flags.get("vllm_quantization"), bool(flags.get("partial_rollout")), bool(flags.get("async_train"))


def pairing(runs: list[dict]) -> str:
    """The pairing check: every arm of a seed starts from the same weights (the warm start's hash), the same
    held-out accuracy and, among the arms that sample alike (`sampling`), the same first-step reward (one prompt
    order, one sampling seed). Each engine apart: an FP8 engine's greedy evaluation of the same warm start is its
    own (the fp8 arms pair with each other, not with bf16's)."""
    evals: dict[tuple, set] = {}  # (seed, engine) -> held-out accuracies before training
    firsts: dict[tuple, set] = {}  # (seed, how it samples) -> first-step rewards
    for r in runs:
        how = sampling(r)
        evals.setdefault((r["seed"], how[0]), set()).add(r["start_eval"])
        firsts.setdefault((r["seed"], how), set()).add(r["rewards"][0] if r["rewards"] else None)
    broken = sorted({seed for (seed, _), seen in [*evals.items(), *firsts.items()] if len(seen) > 1})
    if broken:
        return f"Pairing broken at seed(s) {', '.join(map(str, broken))}: their arms started from different places."
    weights: dict[int, set] = {}  # runs made before the warm start's hash was recorded have none
    for r in runs:
        if r.get("warm_start_sha256"):
            weights.setdefault(r["seed"], set()).add(r["warm_start_sha256"])
    if remade := sorted(seed for seed, seen in weights.items() if len(seen) > 1):
        return f"Pairing broken at seed(s) {', '.join(map(str, remade))}: their arms' warm starts are other weights."
    schemes = {sampling(r) for r in runs}
    engines = "" if all(engine is None for engine, *_ in schemes) else ", each engine's arms apart (fp8's its own)"
    apart = ""
    if len({scheme[1:] for scheme in schemes}) > 1:
        apart = "; the first-step reward compared among the arms that sample alike (a chunked or asynchronous regime "\
                "draws its own first batch from the same weights)"  # fmt: skip
    seeds = len({r["seed"] for r in runs})
    return (f"Pairing: at each of the {seeds} seeds every arm started from the same held-out accuracy and the same "
            f"first-step reward{engines}{apart}.")  # fmt: skip


def versions_cell(row: dict) -> str:
    """Weight versions per row and, beside them, the share of rows that span two or more (partial rollouts)."""
    if row["versions_per_row"] is None:
        return "-"
    mixed = f" ({row['mixed_rows']:.0%})" if row.get("mixed_rows") is not None else ""
    return f"{row['versions_per_row']:.2f}{mixed}"


def render(payload: dict, out_dir: Path) -> str:
    runs, stem = payload["results"]["runs"], payload.get("benchmark", NAME)
    margin = payload.get("config", {}).get("margin", MARGIN)
    rows = analyse(runs, margin)
    lines = progress(runs, payload.get("config", {}).get("plan")) + [
        "| regime | correction | seeds | held-out (start -> last) | vs none | vs tis | vs sync | TOST vs none "
        f"(±{margin}) | reward | masked | mean abs log ratio | length | staleness | versions / row (rows of 2+) | "
        "collapses (reward / grad) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        eq = (r["final_eval_vs_none"] or {}).get("p_tost")
        lines.append(
            f"| {r['regime']} | {r['correction']} | {r['seeds']} | {_fmt(r['start_eval'], '.3f')} -> "
            f"{_fmt(r['final_eval'], '.3f')} | {_cell(r['final_eval_vs_none'])} | {_cell(r['final_eval_vs_tis'])} | "
            f"{_cell(r['final_eval_vs_sync'])} | {_fmt(eq, '.2f')} | {_fmt(r['final_reward'], '.3f')} | "
            f"{_fmt(r['masked_frac'], '.2%')} | {_fmt(r['mean_abs_log_ratio'], '.3f')} | "
            f"{_fmt(r['response_length'], '.1f')} | "
            f"{_fmt(r['staleness_trained'], '.2f')} | {versions_cell(r)} | "
            f"{r['collapses']['reward']} / {r['collapses']['grad_norm']} |"
        )
    lines += ["", "Differences of the held-out accuracy, paired over seeds: mean [95% t-interval] and the t-test's "
              "p-value Holm-adjusted over every comparison of the endpoint (bold: below 0.05). TOST: the p-value "
              f"that the difference to `none` lies within ±{margin} (small: equivalent).",
              f"Endpoints: {json.dumps(ENDPOINTS)}."]  # fmt: skip
    lines += render_head_to_head(head_to_head(runs, margin), margin)
    lines += render_mechanisms(mechanisms(runs))
    lines += render_replay(replay_effect(runs, margin))
    lines += render_by_seed(runs)
    hosts = sorted({r["host_id"] for r in runs})
    clean = sum(r["clean"] for r in runs)
    lines.append(f"\n{pairing(runs)}")
    lines.append(f"\n_{len(runs)} runs ({clean} from a clean tree) on host(s) {', '.join(hosts)}; commits "
                 f"{', '.join(sorted({r['commit'][:9] for r in runs}))}._")  # fmt: skip
    text = "\n".join(lines)
    (out_dir / f"{stem}.md").write_text(text + "\n")
    return text


# ------------------------------------------------------------------------------------------ entry point
def screening_or_plan(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Plan:
    """What this invocation runs: the registered plan of --plan (refused beside a flag that would change it), or
    a screening made of the flags given and their defaults."""
    given = [f"--{k}" for k in ("seeds", "regimes", "corrections", "steps", "name", "model")
             if getattr(args, k) is not None]  # fmt: skip
    if args.plan is not None:
        if given:
            parser.error(f"--plan {args.plan} runs as registered: drop {', '.join(given)}")
        return PLANS[args.plan]
    return Plan(name=args.name or NAME, seeds=tuple(args.seeds or parse_seeds("101-103")),
                regimes=tuple(args.regimes or (g for g in REGIMES if g not in MOE_ONLY)),
                corrections=tuple(args.corrections or CORRECTIONS),
                steps=args.steps or 150, margin=MARGIN, model=args.model or "dense")  # fmt: skip


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", choices=list(PLANS), default=None,
                   help="run a registered confirmatory stage exactly as registered (its seeds, regimes, corrections, "
                   "steps, margin, model and file); refused beside any of the six flags it sets")  # fmt: skip
    p.add_argument("--seeds", type=parse_seeds, default=None, help="e.g. 101-103 or 1,3,5 (default 101-103)")
    p.add_argument("--regimes", nargs="+", choices=list(REGIMES), default=None, help="default: every regime")
    p.add_argument("--corrections", nargs="+", type=correction_arm, default=None,
                   help=f"of {', '.join(CORRECTIONS)}; NAME@LOW,HIGH: one at another band (default: all)")  # fmt: skip
    p.add_argument("--steps", type=int, default=None, help="RL steps per run (default 150)")
    p.add_argument("--model", choices=("dense", "moe"), default=None,
                   help="the built-in model: dense (default) or moe, its mixture-of-experts twin")  # fmt: skip
    p.add_argument("--name", default=None, help=f"the JSON's name (default {NAME}; a plan's is its own)")
    p.add_argument("--warm-cache", type=Path, default=Path(tempfile.gettempdir()) / "is_long_study_warm",
                   help="where warm starts are kept between invocations on this host (one per seed)")  # fmt: skip


def _refuse(message: str):
    raise UsageError(message)


def planned(args: argparse.Namespace) -> Plan:
    """screening_or_plan for the study runner: a command line it refuses ends in one line."""
    study = screening_or_plan(types.SimpleNamespace(error=_refuse), args)
    if study.model == "dense" and (moe_only := [g for g in study.regimes if g in MOE_ONLY]):
        raise UsageError(f"--regimes {' '.join(moe_only)}: replays a mixture-of-experts model's routes "
                         "(--plan moe_screening)")  # fmt: skip
    return study


def run(args: argparse.Namespace, out) -> None:
    study, code = planned(args), out.code
    seeds, regimes, corrections = list(study.seeds), list(study.regimes), list(study.corrections)
    stored = stored_results(out.path)
    with tempfile.TemporaryDirectory(prefix="is_long_study_") as scratch:  # where a missing warm start is built
        weights = functools.cache(
            lambda seed: warm_start(seed, Path(scratch), code, args.warm_cache, study.model)[1]["sha256"]
        )
        runs, aside = set_aside_other_hosts(stored.get("runs", []), seeds, arms(regimes, corrections), study.steps,
                                            code["host_id"], weights)  # fmt: skip
    for seed in sorted({r["seed"] for r in aside}):
        print(f"[is_long_study] seed {seed}: its runs so far were made on another host from other weights; set "
              "aside, run whole here")  # fmt: skip
    aside += stored.get("set_aside", [])

    def save(current: list[dict]) -> None:  # atomic: a stop mid-write never loses the runs already measured
        config = {"task": TASK, "regimes": REGIMES, "corrections": CORRECTIONS, "endpoints": ENDPOINTS,
                  "margin": study.margin, "held_out": HELD_OUT, "flags": STUDY_FLAGS,
                  "plan": asdict(study) if args.plan else None}  # fmt: skip
        out.save(current, config, set_aside=aside)

    pictures = args.output / f"{study.name}_drift"  # each run's drift picture (trainer/drift_plot.py)
    run_study(seeds, regimes, corrections, study.steps, runs, save, code, args.warm_cache, pictures, study.model)


def main(argv=None) -> int:
    name = lambda args: planned(args).name  # noqa: E731
    return study_main(argv, __doc__, name, run, render, options=options, clean=True)


if __name__ == "__main__":
    sys.exit(main())
