"""What the studies that run train_ppo_ray share: the embedded default's warm start and run config, and each
run's summary (rewards, mismatch, masks, held-out accuracy, the series the plots draw) from its history. The
studies import these from here rather than from each other."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

SERIES = ["rollout/reward_mean", "is/token_masked_frac", "is/ess", "is/vllm_kl", "rollout/logprob_abs_diff_mean",
          "policy/grad_norm"]  # fmt: skip
STUDY_SERIES = [*SERIES, "async/staleness_mean", "async/partial_mixed_rows", "rollout/logprob_abs_diff_p99"]
EVAL_KEY = "eval/eval/pass@1"  # the held-out greedy exact match the SmolLM2 runs log (--eval_dataset)


def warm_start(seed: int, workdir: Path) -> str:
    """The embedded default's starting model for `seed` (the same warm start train_ppo_ray does)."""
    from reinforce_pro.models.tiny import build_tiny_model
    from reinforce_pro.trainer.sft_warmup import arithmetic_warm_start

    out = workdir / f"warm_{seed}"
    arithmetic_warm_start(build_tiny_model(workdir / f"base_{seed}", seed=seed), out, steps=200, seed=seed)
    return str(out)


def base_config(pretrain: str, seed: int, steps: int, overrides: dict | None = None):
    """The embedded default's run config for `pretrain`: a --pretrain run gets no presets, so they are applied
    here to the flag defaults, then `overrides` (flag dests -> values; the sections' own checks run in
    run_config)."""
    from reinforce_pro.cli.flags_to_config import run_config
    from reinforce_pro.cli.presets import EMBEDDED
    from reinforce_pro.cli.train_ppo_ray import parse_args

    args = parse_args(["--pretrain", pretrain])
    presets = {k: v for k, v in EMBEDDED.items() if k not in ("enable_vllm_is_correction", "vllm_is_correction_type")}
    vars(args).update(presets, seed=seed, max_samples=32 * steps)  # the correction is each run's (run_config_for)
    vars(args).update(overrides or {})
    return run_config(args)


def summarise_run(history: list[dict], wall: float) -> dict:
    rewards = [h["rollout/reward_mean"] for h in history]
    start = statistics.mean(rewards[:10])
    moving = [statistics.mean(rewards[max(0, i - 9) : i + 1]) for i in range(len(rewards))]
    reached = next((i + 1 for i, m in enumerate(moving) if i >= 9 and m >= start + 0.10), None)
    norms = [h.get("policy/grad_norm", 0.0) for h in history]
    med = statistics.median(norms) if norms else 0.0
    every = max(1, len(history) // 50)
    return {
        "final_reward": statistics.mean(rewards[-10:]),
        "start_reward": start,
        "auc_reward": statistics.mean(rewards),
        "steps_to_plus_0.10": reached,
        "grad_norm_spikes": sum(n > 3 * med for n in norms) if med > 0 else 0,
        "wall_s": wall,
        "series": {k: [h.get(k, float("nan")) for h in history[::every]] for k in SERIES},
        "series_step_every": every,
        # None where the run logs no such metric (no IS correction -> no is/*)
        **{f"mean_{k}": statistics.mean(h[k] for h in history) if k in history[0] else None for k in SERIES[1:5]},
        # the lag the run actually had (0 control / bf16, K stale<K>, what the producer achieved async<Q>)
        "mean_staleness": statistics.mean(h.get("async/staleness_mean", 0.0) for h in history),
    }


def summarise(history: list[dict], wall: float, evals: list[tuple[int, float]] = ()) -> dict:
    """compare_is_correction's per-run summary plus what this study reads: every step's reward and gradient
    norm (collapse is judged from them at analysis time), mismatch, masked fraction, mixed rows, and the
    held-out evaluations (step, exact match) where the task has them."""
    out = summarise_run(history, wall)
    if evals:
        out.update(evals=[list(e) for e in evals], start_eval=evals[0][1], final_eval=evals[-1][1])

    def mean_of(key):
        values = [h[key] for h in history if key in h]
        return statistics.fmean(values) if values else None

    out.update(
        rewards=[h["rollout/reward_mean"] for h in history],  # every step: collapse is judged from these
        step_s=[h["time/step"] for h in history],  # every step: reward against wall-clock time
        mean_lag=mean_of("async/max_lag"),  # the lead --async_lag_target allowed (adaptive runs only)
        grad_norms=[h.get("policy/grad_norm") for h in history],
        mean_abs_log_ratio=mean_of("rollout/logprob_abs_diff_mean"),
        p99_abs_log_ratio=mean_of("rollout/logprob_abs_diff_p99"),
        masked_frac=mean_of("is/token_masked_frac"),
        mixed_rows=mean_of("async/partial_mixed_rows"),
        versions_per_row=mean_of("async/partial_versions_per_row"),
        series={k: [h.get(k, float("nan")) for h in history[:: out["series_step_every"]]] for k in STUDY_SERIES},
        positions={k: mean_of(k) for k in sorted({k for h in history for k in h if k.startswith("is_pos/")})},
    )
    return out


def held_out(run_dir: Path) -> list[tuple[int, float]]:
    """(step, held-out exact match) of every evaluation the run logged, the one before training included."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r[EVAL_KEY]) for r in rows if EVAL_KEY in r]


# ---------------------------------------------------------------------------------- SmolLM2 on chain_sum
# The packaged SmolLM2-135M-Instruct learning reasoning-gym's chain_sum: bench_smollm2 measures it, is_study
# trains on it.
TASK, TASK_SETTINGS = "chain_sum", {"max_terms": 2, "max_digits": 1}  # a*b-digit sums: SmolLM2 starts at ~1/3
BAND = (0.5, 5.0)
REWARD = Path(__file__).resolve().parent.parent / "examples" / "python" / "reward_reasoning_gym.py"


def run_flags(model: Path, data: Path) -> list[str]:
    """The learning run's settings, sized for 2 cores: 4 prompts x 4 samples per step, responses <= 16 tokens."""
    return [
        "--pretrain", str(model), "--prompt_data", str(data / "train.jsonl"), "--input_key", "question",
        "--label_key", "entry", "--apply_chat_template", "--remote_rm_url", str(REWARD),
        "--advantage_estimator", "reinforce_baseline", "--n_samples_per_prompt", "4", "--rollout_batch_size", "4",
        "--train_batch_size", "16", "--micro_train_batch_size", "8", "--micro_rollout_batch_size", "16",
        "--max_new_tokens", "16", "--prompt_max_len", "96", "--max_len", "128", "--temperature", "1.0",
        "--actor_learning_rate", "5e-6", "--lr_scheduler", "constant_with_warmup", "--lr_warmup_ratio", "0",
        "--init_kl_coef", "0", "--param_dtype", "fp32", "--vllm_dtype", "bfloat16", "--zero_stage", "2",
        "--enable_vllm_is_correction", "--vllm_is_correction_type", "reinforce_pro",
        "--vllm_is_truncated_threshold", str(BAND[0]), str(BAND[1]),
        "--eval_dataset", str(data / "eval.jsonl"), "--eval_temperature", "0", "--eval_n_samples_per_prompt", "1",
        "--vllm_cpu_kvcache_gib", "2", "--actor_num_gpus_per_node", "1", "--vllm_num_engines", "1",
    ]  # fmt: skip


def prepare_inputs(model_dir: Path, data_dir: Path, n_train: int, n_eval: int) -> float:
    from reinforce_pro.data.reasoning_tasks import write_task
    from reinforce_pro.models.packaged import prepare

    start = time.perf_counter()
    prepare("smollm2-135m-instruct", model_dir)
    if not (data_dir / "eval.jsonl").is_file():
        write_task(TASK, data_dir, n_train, n_eval, seed=0, config=TASK_SETTINGS)
    return time.perf_counter() - start
