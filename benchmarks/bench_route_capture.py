"""What recording every token's experts costs a CPU MoE engine (rollout/route_capture.py).

Runs on: CPU (the embedded MoE model at the running-sum task's size; nothing downloaded).
Takes:   ~3 minutes on 2 cores.

    python -m benchmarks.bench_route_capture                # measure, write JSON, render the table
    python -m benchmarks.bench_route_capture --render FILE  # re-render from a JSON

Three engines of the run's engine class (rollout/vllm_engine.VLLMEngine, without Ray), one after the other, on the
same batches of 256 running-sum responses of exactly `--tokens` tokens (32 prompts x 8, one random stream):
- `compiled`: vLLM's default (torch.compile), no capture: what an MoE engine would run without routes;
- `eager`: enforce_eager, no capture: the cost of running eagerly alone;
- `eager + capture`: what an MoE run's engine runs (capture forces eager: a compiled graph does not call the
  router hooks at each step).
Median seconds per batch and tokens per second; the capture's routes per batch (int16: positions x layers x k).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.bench_study_generate import PROMPTS, SAMPLES, batches, count_engine_steps
from benchmarks.common import bench_main, scratch_dir

NAME = "bench_route_capture"
ENGINES = {  # name -> EngineConfig fields
    "compiled": {},
    "eager": {"enforce_eager": True},
    "eager + capture": {"capture_routes": True},
}


def time_engine(model: str, work: list, fields: dict, tokens: int) -> dict:
    """One engine: a warm-up batch, then every batch of `work` timed, from one reseeded random stream."""
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine

    start = time.perf_counter()
    engine = VLLMEngine(EngineConfig(model, dtype="bfloat16", max_model_len=96, **fields))
    start_s = time.perf_counter() - start
    sampling = {"temperature": 1.0, "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True}
    engine.reseed(1234)
    engine.generate(work[0], sampling)  # warm-up: the first batch of a fresh engine pays one-off costs
    counter, seconds, route_bytes = count_engine_steps(engine), [], 0
    for batch in work[1:]:
        before, t = counter[0], time.perf_counter()
        out = engine.generate(batch, sampling)
        seconds.append(time.perf_counter() - t)
        steps = counter[0] - before
        route_bytes = sum(g.routes.numel() * g.routes.element_size() for g in out if g.routes is not None)
    del engine
    median = statistics.median(seconds)
    return {"start_s": start_s, "batch_s": seconds, "median_s": median, "engine_steps": steps,
            "tokens_per_s": PROMPTS * SAMPLES * tokens / median, "route_bytes_per_batch": route_bytes}  # fmt: skip


def measure(args) -> dict:
    from reinforce_pro.data import EMBEDDED_TASKS
    from reinforce_pro.models.tiny import build_tiny_moe_model

    with scratch_dir("bench_route_capture_") as workdir:
        layers = EMBEDDED_TASKS["running_sum"]().model_layers
        model = str(build_tiny_moe_model(workdir / "model", seed=0, num_layers=layers))
        work = batches(model, args.batches + 1)
        runs = {name: time_engine(model, work, fields, args.tokens) for name, fields in ENGINES.items()}
    return {"runs": runs, "rows": PROMPTS * SAMPLES, "prompt_tokens": statistics.fmean(map(len, work[0]))}


def render(payload: dict, out_dir: Path) -> str:
    r, c, m = payload["results"], payload["config"], payload["machine"]
    base = r["runs"]["compiled"]["median_s"]
    lines = [
        f"A CPU MoE engine recording routes: {r['rows']} responses of exactly {c['tokens']} tokens from prompts of "
        f"{r['prompt_tokens']:.1f} tokens, the embedded MoE model (2 layers, 8 experts, top-2), {c['batches']} "
        f"timed batches each; {m['cpu']} ({m['cpu_count']} cores), commit {payload['commit'][:12]}",
        "",
        "| engine | start s | median s / batch | tokens / s | against compiled | engine steps / batch | routes / batch "
        "| batches (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in r["runs"].items():
        routes = f"{run['route_bytes_per_batch'] / 1024:.0f} KiB" if run["route_bytes_per_batch"] else "-"
        lines.append(
            f"| {name} | {run['start_s']:.1f} | {run['median_s']:.2f} | {run['tokens_per_s']:.0f} | "
            f"{run['median_s'] / base:.2f}x the time | {run['engine_steps']} | {routes} | "
            + ", ".join(f"{s:.2f}" for s in run["batch_s"])
            + " |"
        )
    text = "\n".join(lines) + "\n"
    (out_dir / f"{payload['benchmark']}.md").write_text(text)
    return text


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=64, help="tokens every response decodes")
    p.add_argument("--batches", type=int, default=4, help="timed batches per engine")


def measured(args) -> tuple[dict, dict]:
    return {"tokens": args.tokens, "batches": args.batches}, measure(args)


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
