"""W3's generation on a bare vLLM engine: what the generate phase of a W3 step costs without the trainer.

Runs on: CPU, with the `models` extra for SmolLM2-135M-Instruct (prepared once under ~/.cache/reinforce_pro).
Takes:   ~2 minutes on 2 cores (two engine starts, 7 batches each).

    python -m benchmarks.bench_generate_ceiling                 # measure, write JSON, render the table
    python -m benchmarks.bench_generate_ceiling --render FILE   # re-render from a JSON

The run's engine class (rollout/vllm_engine.VLLMEngine), built in this process without Ray, samples W3's batches
as bench_peers' W3 step does: 4 chat-templated "What is a + b?" prompts x 8 samples, at most 64 new tokens,
temperature 1, fp32. It reports seconds per batch (median of the batches after `--warmup` ones) and response
tokens per second, once without and once with vLLM's prefix caching (the 8 samples of a prompt share it). A
run's `time/generate` on the same batches, against this, says how much of the generate phase is the engine's
own decoding and how much the pipeline around it; the compute bound (every token once through the matmul
parameters at the machine's GEMM rate) is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import bench_main

NAME = "bench_generate_ceiling"


def w3_batches(workdir: Path, batches: int) -> tuple[dict, list[list[list[int]]]]:
    """bench_peers' W3 spec and `batches` batches of its prompts' token ids (chat template), 8 copies each."""
    from transformers import AutoTokenizer

    from benchmarks.bench_peers import WORKLOADS, chat_prompt_ids, prepare

    spec = prepare(workdir, WORKLOADS["W3"], warmup_steps=2)
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    records = [json.loads(line) for line in Path(spec["prompts"]).read_text().splitlines()]
    per = spec["prompts_per_step"]
    out = []
    for b in range(batches):
        prompts = records[(b * per) % len(records) :][:per]
        out.append(
            [chat_prompt_ids(tokenizer, r["question"]) for r in prompts for _ in range(spec["n_samples_per_prompt"])]
        )
    return spec, out


def time_engine(spec: dict, batches: list, prefix_caching: bool, warmup: int) -> dict:
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine

    cfg = EngineConfig(spec["model"], dtype="float32", max_model_len=256, enable_prefix_caching=prefix_caching)
    engine = VLLMEngine(cfg)
    seconds, tokens = [], []
    for batch in batches:
        start = time.perf_counter()
        out = engine.generate(batch, {"temperature": 1.0, "max_tokens": spec["max_new_tokens"]})
        seconds.append(time.perf_counter() - start)
        tokens.append(sum(len(g.token_ids) for g in out))
    del engine
    kept_s, kept_tokens = seconds[warmup:], tokens[warmup:]
    return {"batch_s": seconds, "response_tokens": tokens, "median_batch_s": statistics.median(kept_s),
            "tokens_per_s": sum(kept_tokens) / sum(kept_s)}  # fmt: skip


def measure(args) -> dict:
    from benchmarks.bench_peers import gemm_peak_gflops

    with tempfile.TemporaryDirectory() as tmp:
        spec, batches = w3_batches(Path(tmp), args.batches)
        peak = gemm_peak_gflops()
        runs = {name: time_engine(spec, batches, prefix, args.warmup) for name, prefix in
                (("plain", False), ("prefix caching", True))}  # fmt: skip
    prompt_tokens = statistics.mean(sum(len(ids) for ids in b) for b in batches[args.warmup :])
    response_tokens = statistics.mean(runs["plain"]["response_tokens"][args.warmup :])
    bound = 2 * spec["matmul_params"] * (prompt_tokens + response_tokens) / (peak * 1e9)
    return {"runs": runs, "gemm_peak_gflops": peak, "matmul_params": spec["matmul_params"], "compute_bound_s": bound,
            "prompt_tokens_mean": prompt_tokens, "response_tokens_mean": response_tokens}  # fmt: skip


def render(payload: dict, out_dir: Path) -> str:
    r, c, m = payload["results"], payload["config"], payload["machine"]
    lines = [
        f"W3's generation on a bare engine (VLLMEngine without Ray): {c['batches']} batches of 4 prompts x 8 "
        f"samples, <= 64 tokens, fp32, the first {c['warmup']} left out; {m['cpu']} ({m['cpu_count']} cores), "
        f"commit {payload['commit'][:12]}",
        "",
        "| engine | median s / batch | response tokens / s | batches (s) |",
        "|---|---|---|---|",
        *(
            f"| {name} | {run['median_batch_s']:.2f} | {run['tokens_per_s']:.0f} | "
            + ", ".join(f"{s:.2f}" for s in run["batch_s"])
            + " |"
            for name, run in r["runs"].items()
        ),
        "",
        f"Compute bound: 2 x {r['matmul_params'] / 1e6:.1f}M x ({r['prompt_tokens_mean']:.0f} prompt + "
        f"{r['response_tokens_mean']:.0f} response tokens) / {r['gemm_peak_gflops']:.0f} GFLOP/s = "
        f"{r['compute_bound_s']:.2f} s a batch",
    ]
    text = "\n".join(lines) + "\n"
    (out_dir / f"{payload['benchmark']}.md").write_text(text)
    return text


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", type=int, default=7, help="batches per engine")
    p.add_argument("--warmup", type=int, default=2, help="leading batches left out (as bench_peers' steps)")


def measured(args) -> tuple[dict, dict]:
    return {"batches": args.batches, "warmup": args.warmup}, measure(args)


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
