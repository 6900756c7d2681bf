"""Where the time of one RL step goes, on the embedded default.

Runs on: CPU (the embedded default: tiny Qwen2, bf16 vLLM CPU engine, fp32 DeepSpeed policy).
Takes:   ~3 minutes on 2 cores (engine start-up, 40 RL steps, the bare-vLLM baseline).

    python -m benchmarks.bench_step                    # measure, write JSON, print + render the table
    python -m benchmarks.bench_step --render FILE      # re-render from a JSON

Reports, over the steps after `--warmup_steps`: median seconds per phase (generate, make_experience,
train, weight_sync), response tokens per second, and two targets:
- rollout efficiency = in-pipeline generation tokens/s (response tokens / time/generate, so it includes
  the Ray call, tokenisation and batching around the engine) divided by a bare `vllm.LLM.generate` on the
  same model, prompts and sampling parameters, measured in the same run in an actor of the same size
  (target >= 0.8);
- weight-sync share = time/weight_sync / time/step (target <= 10%).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import reinforce_pro  # noqa: F401  (before ray: keeps a local cluster on loopback, see ray_env.py)
from benchmarks.common import bench_main, scratch_dir

PHASES = ["generate", "make_experience", "train", "weight_sync", "step"]
TARGETS = {"rollout_efficiency": 0.8, "weight_sync_share": 0.10}


class BareLLM:
    """vllm.LLM with nothing around it: the baseline for rollout efficiency."""

    def __init__(self, cfg):
        import os

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kv_cache_gib))
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.llm = LLM(model=cfg.model_path, dtype=cfg.dtype, seed=cfg.seed, max_model_len=cfg.max_model_len,
                       logprobs_mode="processed_logprobs")  # fmt: skip

    def tokens_per_s(self, prompt_batches: list[list[list[int]]], sampling: dict) -> float:
        from vllm import SamplingParams

        params = SamplingParams(**sampling, logprobs=0)
        self.llm.generate([{"prompt_token_ids": p} for p in prompt_batches[0]], params, use_tqdm=False)  # warm-up
        tokens, seconds = 0, 0.0
        for batch in prompt_batches:
            start = time.perf_counter()
            outs = self.llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
            seconds += time.perf_counter() - start
            tokens += sum(len(o.outputs[0].token_ids) for o in outs)
        return tokens / seconds


def measure(steps: int, warmup_steps: int) -> dict:
    with scratch_dir("bench_step_") as run_dir:  # the run's checkpoints, read by the bare engine below
        return measure_in(run_dir, steps, warmup_steps)


def measure_in(run_dir: Path, steps: int, warmup_steps: int) -> dict:
    import ray

    from reinforce_pro.cli.train_ppo_ray import parse
    from reinforce_pro.rollout.sampler import encode_prompt, sampling_params
    from reinforce_pro.rollout.vllm_engine import EngineConfig
    from reinforce_pro.run.driver import build_and_fit
    from reinforce_pro.run.prepare import prepare

    args, run_cfg = parse(["--save_path", str(run_dir), "--max_samples", str(32 * steps)])
    plan = prepare(run_cfg)
    history = build_and_fit(run_cfg, plan)[warmup_steps:]

    # The baseline: the same (final) model, dtype, prompts and sampling, no pipeline around it.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(plan.model_path)
    rollout = run_cfg.rollout
    n = args.n_samples_per_prompt
    batches = [
        [
            encode_prompt(tok, p["prompt"], rollout.prompt_max_len)
            for p in plan.prompts[i : i + args.rollout_batch_size]
            for _ in range(n)
        ]
        for i in range(0, min(len(plan.prompts), 10 * args.rollout_batch_size), args.rollout_batch_size)
    ]
    cfg = EngineConfig(model_path=str(run_dir / "final_model"), dtype=args.vllm_dtype, seed=args.seed,
                       max_model_len=args.max_len, cpu_kv_cache_gib=args.vllm_cpu_kvcache_gib)  # fmt: skip
    bare = ray.remote(BareLLM).options(num_cpus=1).remote(cfg)
    bare_tps = ray.get(bare.tokens_per_s.remote(batches, sampling_params(rollout)))
    ray.kill(bare)

    med = {p: statistics.median(h[f"time/{p}"] for h in history) for p in PHASES}
    tokens = statistics.median(h["rollout/num_samples"] * h["rollout/response_length_mean"] for h in history)
    pipeline_gen_tps = statistics.median(
        h["rollout/num_samples"] * h["rollout/response_length_mean"] / h["time/generate"] for h in history
    )
    return {
        "steps_measured": len(history),
        "median_seconds": med,
        "share_of_step": {p: med[p] / med["step"] for p in PHASES if p != "step"},
        "response_tokens_per_step": tokens,
        "tokens_per_s": statistics.median(h["perf/tokens_per_s"] for h in history),
        "pipeline_generate_tokens_per_s": pipeline_gen_tps,
        "bare_vllm_tokens_per_s": bare_tps,
        "rollout_efficiency": pipeline_gen_tps / bare_tps,
        "weight_sync_share": statistics.median(h["time/weight_sync"] / h["time/step"] for h in history),
        "reward_first_last": [history[0]["rollout/reward_mean"], history[-1]["rollout/reward_mean"]],
    }


def render(payload: dict, out_dir: Path) -> str:
    r, m = payload["results"], payload["machine"]
    lines = ["| phase | median s | share of step |", "|---|---|---|"]
    for p in PHASES:
        share = r["share_of_step"].get(p)
        lines.append(f"| {p} | {r['median_seconds'][p]:.3f} | {'' if share is None else f'{100 * share:.1f}%'} |")
    lines += [
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| response tokens / s (whole step) | {r['tokens_per_s']:.0f} | |",
        f"| generation tokens / s in the pipeline | {r['pipeline_generate_tokens_per_s']:.0f} | |",
        f"| bare vllm.LLM.generate tokens / s | {r['bare_vllm_tokens_per_s']:.0f} | |",
        f"| rollout efficiency | {r['rollout_efficiency']:.2f} | >= {TARGETS['rollout_efficiency']} |",
        f"| weight-sync share of the step | {100 * r['weight_sync_share']:.1f}% "
        f"| <= {100 * TARGETS['weight_sync_share']:.0f}% |",
        "",
        f"{r['steps_measured']} steps of the embedded default after warm-up; {m['cpu']} ({m['cpu_count']} cores), "
        f"torch {m['torch']}, commit {payload['commit'][:12]}.",
    ]  # fmt: skip
    table = "\n".join(lines)
    (out_dir / "bench_step.md").write_text(table + "\n")
    return table


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=40, help="RL steps to run")
    p.add_argument("--warmup_steps", type=int, default=5, help="leading steps left out of the statistics")


def measured(args) -> tuple[dict, dict]:
    results = measure(args.steps, args.warmup_steps)
    return {"steps": args.steps, "warmup_steps": args.warmup_steps, "job": "embedded default of train_ppo_ray"}, results


def main(argv=None) -> int:
    return bench_main(argv, "bench_step", __doc__, options, measured, render)


if __name__ == "__main__":
    sys.exit(main())
