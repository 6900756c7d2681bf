"""How long a CPU vLLM engine takes to start, by compile mode, each start in a fresh process.

    python -m benchmarks.bench_engine_start --model ~/.cache/reinforce_pro/smollm2-135m-instruct
    python -m benchmarks.bench_engine_start --render benchmarks/results/bench_engine_start.json

Modes (all through reinforce_pro's VLLMEngine, bf16, max_model_len 512, as the SmolLM2 recipes run it):
- `aot` (VLLM_USE_AOT_COMPILE=1): torch.compile, the compiled function saved ahead of time and keyed by the model's
  path (what a run uses for a model directory the user names: EngineConfig.aot_compile).
- `no-aot` (VLLM_USE_AOT_COMPILE=0): torch.compile with vLLM's graph cache (Inductor's compiled graphs).
- `eager` (--enforce_eager): no compilation.
- `no-aot-4096`: `no-aot` with vLLM's own CPU budget of 4,096 tokens per forward instead of reinforce_pro's
  512 (vllm_engine.CPU_MAX_BATCHED_TOKENS): the start's dummy forward is that many tokens.
Each mode gets its own empty VLLM_CACHE_ROOT and starts twice in a row: the first start is a machine's first
run, the second what every later run pays. "start" is constructing the engine plus one 1-token generation
(what the trainer waits for before its first step, interpreter start-up and imports included); "decode" is
the throughput of 32 prompts x 64 sampled tokens after that, since a faster start may generate slower.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import PACKAGED_MODELS, bench_main
from reinforce_pro.rollout.vllm_engine import CPU_MAX_BATCHED_TOKENS

NAME = "bench_engine_start"
MODES = {  # mode -> (environment, enforce_eager, tokens per forward)
    "aot": ({"VLLM_USE_AOT_COMPILE": "1"}, False, CPU_MAX_BATCHED_TOKENS),
    "no-aot": ({"VLLM_USE_AOT_COMPILE": "0"}, False, CPU_MAX_BATCHED_TOKENS),
    "no-aot-4096": ({"VLLM_USE_AOT_COMPILE": "0"}, False, 4096),  # vLLM's CPU default budget
    "eager": ({}, True, CPU_MAX_BATCHED_TOKENS),
}
STARTS = ("first", "second")

CHILD = """
import json, sys, time
start = time.perf_counter()
from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine
model, eager, budget = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
engine = VLLMEngine(EngineConfig(model_path=model, dtype="bfloat16", max_model_len=512, enforce_eager=eager,
                                 cpu_kv_cache_gib=2, seed=0, cpu_max_batched_tokens=budget))
prompt = list(range(100, 160))
engine.generate([prompt], {"temperature": 1.0, "max_tokens": 1})
ready = time.perf_counter() - start
begin = time.perf_counter()
out = engine.generate([prompt] * 32, {"temperature": 1.0, "max_tokens": 64, "ignore_eos": True})
decode = sum(len(g.token_ids) for g in out) / (time.perf_counter() - begin)
print("RESULT " + json.dumps({"start_s": ready, "decode_tok_s": decode}))
"""


def start_once(model: str, mode: str, cache_root: Path) -> dict:
    env_extra, eager, budget = MODES[mode]
    env = {**os.environ, **env_extra, "VLLM_CACHE_ROOT": str(cache_root), "PYTHONWARNINGS": "ignore"}
    env.pop("REINFORCE_PRO_LOG_DIR", None)
    wall = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, model, "1" if eager else "0", str(budget)], env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    wall = time.perf_counter() - wall
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"{mode}: exit {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}")
    cache_failures = (done.stdout + done.stderr).count("Compiling model again due to a load failure")
    return {**json.loads(line.removeprefix("RESULT ")), "process_s": wall, "cache_load_failures": cache_failures}


def run(model: str, modes: list[str]) -> dict:
    results = {}
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix=f"vllm_cache_{mode}_") as cache_root:
            for start in STARTS:
                print(f"[engine start] {mode}, {start} start ...", flush=True)
                results[f"{mode}/{start}"] = record = start_once(model, mode, Path(cache_root))
                print(f"[engine start] {mode}, {start}: {record['start_s']:.1f} s to the first token, "
                      f"{record['decode_tok_s']:.0f} tok/s decode", flush=True)  # fmt: skip
    return results


def render(payload: dict, out_dir: Path) -> str:
    results = payload["results"]
    lines = [f"# CPU vLLM engine start (commit {payload['commit'][:12]}, {payload['config']['model_name']})", "",
             "| mode | first start (s) | later starts (s) | decode tok/s (later start) | cache load failures |",
             "|---|---|---|---|---|"]  # fmt: skip
    for mode in MODES:
        if f"{mode}/first" not in results:
            continue
        first, second = results[f"{mode}/first"], results[f"{mode}/second"]
        lines.append(f"| {mode} | {first['start_s']:.1f} | {second['start_s']:.1f} | {second['decode_tok_s']:.0f} "
                     f"| {first['cache_load_failures']} / {second['cache_load_failures']} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out_dir / f"{NAME}.md").write_text(text)
    return text


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, default=PACKAGED_MODELS / "smollm2-135m-instruct")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))


def measured(args) -> tuple[dict, dict]:
    config = {"model_name": args.model.name, "dtype": "bfloat16", "max_model_len": 512, "modes": args.modes,
              "decode": "32 prompts x 64 tokens, temperature 1"}  # fmt: skip
    return config, run(str(args.model), args.modes)


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    sys.exit(main())
