"""An FP8 engine on CPU: vLLM's own FP8 kernel against rollout/cpu_fp8.py's, and a bf16 engine beside them.

Runs on: CPU (the built-in tiny model of the running-sum task; nothing downloaded).
Takes:   ~5 minutes on 2 cores on a CPU with AMX-INT8 (vLLM's kernel there takes ~2 s an engine step), ~1 elsewhere.

    python -m benchmarks.bench_cpu_fp8                 # measure, write JSON, render the table
    python -m benchmarks.bench_cpu_fp8 --render FILE   # re-render from a JSON

`--vllm_quantization fp8_per_channel` on vLLM's CPU build runs each linear layer as one torch._scaled_mm,
which PyTorch sends to oneDNN's reference matmul on CPUs with AMX-INT8. Three engines of the run's engine
class (rollout/vllm_engine.VLLMEngine, without Ray), one after the other, each on the same work: the
long-response study's 2-layer model, a batch of 256 running-sum responses of exactly `--tokens` tokens
(32 prompts x 8, seeded), then an in-place reload of other weights (a weight sync) and the batch again.
- `fp8, vLLM's kernel`: as vLLM picks it (this script keeps rollout/cpu_fp8.py from registering);
- `fp8, fp32 product`: rollout/cpu_fp8.py's kernel, what the run's engine now uses;
- `bf16`: no quantization, the study's other engines.
The two FP8 engines' token ids and log-probs are compared exactly, before and after the reload: the kernel
changes the speed, not a number. Median of the batches' seconds and the engine steps a batch takes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_study_generate import batches, count_engine_steps, study_model
from benchmarks.common import bench_main

NAME = "bench_cpu_fp8"
ENGINES = {  # name -> (EngineConfig.quantization, whether rollout/cpu_fp8.py may register its kernel)
    "fp8, vLLM's kernel": ("fp8_per_channel", False),
    "fp8, fp32 product": ("fp8_per_channel", True),
    "bf16": (None, True),
}
CPU_FLAGS = ("amx_tile", "amx_int8", "amx_bf16", "amx_fp16", "amx_fp8", "avx512_bf16", "avx512_fp16")


def cpu_flags() -> list[str]:
    """Which of the flags that steer PyTorch's and vLLM's FP8 dispatch this CPU reports (/proc/cpuinfo)."""
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return []
    return [f for f in CPU_FLAGS if f in flags]


def linear_kernels(engine) -> list[str]:
    """The class names of the FP8 kernels the engine's linear layers run (empty for an unquantized engine)."""

    def names(worker):
        model = worker.model_runner.model
        return sorted({type(m.quant_method.fp8_linear).__name__ for m in model.modules()
                       if hasattr(getattr(m, "quant_method", None), "fp8_linear")})  # fmt: skip

    return engine.llm.collective_rpc(names)[0]


def time_engine(model: str, other_weights: bytes, batch: list, quantization, register: bool, tokens: int,
                repeats: int) -> dict:  # fmt: skip
    """One engine: `repeats` batches on the loaded weights, the reload, `repeats` batches on the new ones; the
    first of each group reseeded, so every engine samples the same stream."""
    import reinforce_pro.rollout.cpu_fp8 as cpu_fp8
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine

    keep = cpu_fp8.use_fp32_product_on_cpu
    if not register:
        cpu_fp8.use_fp32_product_on_cpu = lambda: None
    try:
        start = time.perf_counter()
        engine = VLLMEngine(EngineConfig(model, dtype="bfloat16", max_model_len=96, quantization=quantization))
        start_s = time.perf_counter() - start
    finally:
        cpu_fp8.use_fp32_product_on_cpu = keep
    sampling = {"temperature": 1.0, "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True}
    counter, seconds, outputs, steps = count_engine_steps(engine), [], {}, 0
    for phase in ("loaded", "reloaded"):
        if phase == "reloaded":
            engine.update_weights(other_weights)
        engine.reseed(1234)
        for i in range(repeats):
            before, t = counter[0], time.perf_counter()
            out = engine.generate(batch, sampling)
            seconds.append(time.perf_counter() - t)
            steps = counter[0] - before
            if i == 0:
                outputs[phase] = [(g.token_ids, g.log_probs) for g in out]
    kernels = linear_kernels(engine)
    del engine
    return {"start_s": start_s, "batch_s": seconds, "median_s": statistics.median(seconds), "engine_steps": steps,
            "kernels": kernels, "outputs": outputs}  # fmt: skip


def measure(args) -> dict:
    from safetensors.torch import load_file, save

    with tempfile.TemporaryDirectory() as tmp:
        model = study_model(Path(tmp))
        other = build_other(Path(tmp))
        blob = save(load_file(Path(other) / "model.safetensors"))
        batch = batches(model, 1)[0]
        runs = {name: time_engine(model, blob, batch, quantization, register, args.tokens, args.repeats)
                for name, (quantization, register) in ENGINES.items()}  # fmt: skip
    a, b = (runs[name].pop("outputs") for name in ("fp8, vLLM's kernel", "fp8, fp32 product"))
    runs["bf16"].pop("outputs")
    agreement = {phase: compare(a[phase], b[phase]) for phase in a}
    return {"runs": runs, "agreement": agreement, "cpu_flags": cpu_flags(), "rows": len(batch),
            "prompt_tokens": len(batch[0])}  # fmt: skip


def build_other(workdir: Path) -> str:
    """Other weights of the same architecture, for the reload."""
    from reinforce_pro.data import EMBEDDED_TASKS
    from reinforce_pro.models.tiny import build_tiny_model

    return str(build_tiny_model(workdir / "other", seed=1, num_layers=EMBEDDED_TASKS["running_sum"]().model_layers))


def compare(first: list, second: list) -> dict:
    """How two engines' (token ids, log-probs) per response agree: identical tokens, identical log-probs, and the
    largest log-prob difference where the tokens agree."""
    pairs = list(zip(first, second, strict=True))
    same_tokens = sum(ta == tb for (ta, _), (tb, _) in pairs)
    same_logprobs = sum(la == lb for (_, la), (_, lb) in pairs)
    gaps = [abs(x - y) for (ta, la), (tb, lb) in pairs if ta == tb for x, y in zip(la, lb, strict=True)]
    return {"responses": len(first), "same_tokens": same_tokens, "same_logprobs": same_logprobs,
            "max_abs_logprob_diff": max(gaps, default=0.0)}  # fmt: skip


def speedup(base: float, seconds: float) -> str:
    if seconds == base:
        return "-"
    return f"{base / seconds:.0f}x faster" if seconds < base else f"{seconds / base:.1f}x slower"


def render(payload: dict, out_dir: Path) -> str:
    r, c, m = payload["results"], payload["config"], payload["machine"]
    base = r["runs"]["fp8, vLLM's kernel"]["median_s"]
    lines = [
        f"An FP8 engine on CPU: {r['rows']} responses of exactly {c['tokens']} tokens from prompts of "
        f"{r['prompt_tokens']} tokens, the 2-layer running-sum model, {c['repeats']} batches before and after an "
        f"in-place reload; {m['cpu']} ({m['cpu_count']} cores; flags: {', '.join(r['cpu_flags']) or 'none'}), "
        f"commit {payload['commit'][:12]}",
        "",
        "| engine | linear kernel | start s | median s / batch | against vLLM's kernel | engine steps / batch "
        "| ms / engine step | batches (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in r["runs"].items():
        lines.append(
            f"| {name} | {', '.join(run['kernels']) or '- (unquantized)'} | {run['start_s']:.1f} | "
            f"{run['median_s']:.2f} | {speedup(base, run['median_s'])} | {run['engine_steps']} | "
            f"{1000 * run['median_s'] / max(run['engine_steps'], 1):.1f} | "
            + ", ".join(f"{s:.2f}" for s in run["batch_s"])
            + " |"
        )
    lines += ["", "The two FP8 engines, response by response:", "",
              "| weights | responses | same token ids | same log-probs | max abs log-prob difference |",
              "|---|---|---|---|---|"]  # fmt: skip
    for phase, agree in r["agreement"].items():
        lines.append(f"| {phase} | {agree['responses']} | {agree['same_tokens']} | {agree['same_logprobs']} | "
                     f"{agree['max_abs_logprob_diff']:.3g} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out_dir / f"{payload['benchmark']}.md").write_text(text)
    return text


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=16, help="tokens every response decodes")
    p.add_argument("--repeats", type=int, default=2, help="batches before and after the reload, per engine")


def measured(args) -> tuple[dict, dict]:
    return {"tokens": args.tokens, "repeats": args.repeats}, measure(args)


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
