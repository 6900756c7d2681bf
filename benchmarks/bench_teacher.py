"""What a distillation teacher costs a step: an actor's HF forward against a prefill-only vLLM engine.

Runs on: CPU, 2 cores, nothing else running; the `models` extra for the SmolLM2-135M case (prepared once under
~/.cache/reinforce_pro).
Takes:   ~3 minutes with the defaults.

    python -m benchmarks.bench_teacher                 # measure, write JSON, render the table
    python -m benchmarks.bench_teacher --render FILE   # re-render from a JSON

Both backends score the same batch of student rows, shaped as a step of the run whose teacher they serve (left-
padded prompts, right-padded responses), in fp32, in this process (the engine's core in its own, as in a run):
- actor: reinforce_pro's ReferenceWorker, which `--teacher_backend actor` runs (batched_log_probs, micro-batches
  of --micro_rollout_batch_size rows), padded, and packed as --packing_samples packs;
- engine: VLLMEngine.score through EngineTeacher (`--teacher_backend engine`): vLLM's prompt log-probs, the rows'
  kept tokens sent as prompts, the log-probs mapped back to the response columns.
Alternating, after one warm-up round each, median of `--reps`; also each one's start (load, and the engine's
compile) and the largest |difference| of their log-probs on the batch's response tokens.

Cases: `embedded`, the main job's built-in teacher (3.2M, tiny character tokenizer) on 256 rows of 7 prompt + 6
response columns; `smollm2`, SmolLM2-135M-Instruct as the teacher on 64 rows of 96 + 16 (the recipe's shape).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.bench_logprob_head import batch
from benchmarks.common import PACKAGED_MODELS, bench_main, write_table

NAME = "bench_teacher"
CASES = {
    "embedded": {"rows": 256, "prompt": 7, "response": 6, "micro": 64},
    "smollm2": {"rows": 64, "prompt": 96, "response": 16, "micro": 8},
}


def teacher_dir(case: str) -> Path:
    if case == "embedded":
        from reinforce_pro.run.teacher import builtin_teacher

        return builtin_teacher("arithmetic")
    from reinforce_pro.models.packaged import prepare

    return prepare("smollm2-135m-instruct", PACKAGED_MODELS / "smollm2-135m-instruct")


def measure_case(case: str, reps: int) -> dict:
    import torch

    from reinforce_pro.rollout.teacher_engines import EngineTeacher
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine
    from reinforce_pro.workers.configs import ForwardConfig
    from reinforce_pro.workers.policy import ReferenceWorker

    shape = CASES[case]
    path = str(teacher_dir(case))
    t0 = time.perf_counter()
    actor = ReferenceWorker(
        path, 1.0, "fp32", ForwardConfig(attn_implementation="sdpa", micro_batch_size=shape["micro"])
    )
    actor_start = time.perf_counter() - t0
    packing = ForwardConfig(attn_implementation="sdpa", micro_batch_size=shape["micro"], packing_samples=True)
    packed = ReferenceWorker(path, 1.0, "fp32", packing)
    from transformers import AutoTokenizer

    seq, mask = batch(shape["rows"], shape["prompt"], shape["response"], len(AutoTokenizer.from_pretrained(path)))
    t0 = time.perf_counter()
    max_len = shape["prompt"] + shape["response"] + 8
    engine = VLLMEngine(EngineConfig(model_path=path, dtype="float32", max_model_len=max_len, seed=0), 0, "teacher")
    engine_start = time.perf_counter() - t0

    class Local:  # EngineTeacher's engine handle, called in this process
        class score:  # noqa: N801
            @staticmethod
            def remote(sequences, starts):
                return engine.score(sequences, starts)

    import ray

    ray_get = ray.get
    ray.get = lambda futures: futures  # the local handle returns results, not object refs
    try:
        served = EngineTeacher([Local])
        times: dict[str, list[float]] = {"actor": [], "actor_packed": [], "engine": []}
        outputs = {}
        arms = (("actor", actor.log_probs), ("actor_packed", packed.log_probs), ("engine", served.log_probs))
        for rep in range(reps + 1):  # the first round warms up
            for name, fn in arms:
                start = time.perf_counter()
                outputs[name] = fn(seq, mask, shape["response"])
                if rep:
                    times[name].append(time.perf_counter() - start)
    finally:
        ray.get = ray_get
    action = mask[:, -shape["response"] :].bool()
    gap = (outputs["actor"] - outputs["engine"]).abs()[action]
    packed_gap = (outputs["actor"] - outputs["actor_packed"]).abs()[action]
    tokens = int(mask.sum())
    result = {name: statistics.median(ts) for name, ts in times.items()}
    return result | {
        "times": times, "actor_start": actor_start, "engine_start": engine_start, "tokens": tokens,
        "max_abs_logprob_diff": float(gap.max()),
        "max_abs_logprob_diff_packed": float(packed_gap.max()), "teacher": path,
        "params": sum(p.numel() for p in actor.model.parameters()), "torch_threads": torch.get_num_threads(),
    }  # fmt: skip


def render(payload: dict, out_dir: Path) -> str:
    cfg = payload["config"]
    lines = [
        f"A teacher scoring one step's student rows, fp32, median of {cfg['reps']} (seconds)",
        "",
        "| case | teacher | rows x columns | tokens | actor | actor, packed | engine | actor / engine | "
        "start: actor, engine | max abs log-prob diff: engine, packed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, r in payload["results"].items():
        shape = CASES[case]
        lines.append(
            f"| {case} | {r['params'] / 1e6:.1f}M | {shape['rows']} x ({shape['prompt']} + {shape['response']}) | "
            f"{r['tokens']} | {r['actor']:.3f} | {r['actor_packed']:.3f} | {r['engine']:.3f} | "
            f"{r['actor'] / r['engine']:.2f}x | {r['actor_start']:.1f}, {r['engine_start']:.1f} | "
            f"{r['max_abs_logprob_diff']:.1e}, {r['max_abs_logprob_diff_packed']:.1e} |"
        )
    return write_table(payload, lines, out_dir, NAME)


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    p.add_argument("--reps", type=int, default=5)


def measured(args) -> tuple[dict, dict]:
    config = {"cases": args.cases, "reps": args.reps}
    return config, {case: measure_case(case, args.reps) for case in args.cases}


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
