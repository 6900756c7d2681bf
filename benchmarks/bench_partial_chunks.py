"""Synchronous partial rollouts' generate phase: a call per chunk against the rest of each response in one call.

Runs on: CPU (the built-in tiny model of the running-sum task; nothing downloaded).
Takes:   ~2 minutes on 2 cores with the defaults (one engine start, 6 batches of each variant).

    python -m benchmarks.bench_partial_chunks                 # measure, write JSON, render the table
    python -m benchmarks.bench_partial_chunks --render FILE   # re-render from a JSON

Under `--partial_rollout --rollout_staleness K` (studies/is_long_study.py's `stale2+partial` regime) each
response's first chunk is sampled by the weights K + 1 versions back and the rest by those K back. Sampled a
call per chunk of 16 tokens, a 64-token response takes four engine calls, each prefilling its prompt plus the
tokens so far again (the study's engine keeps no prefix cache); since the weights no longer change after the
first chunk, the rest can be one call (PartialRollout.settled). The run's Sampler.sample_in_chunks samples the
study's batches (32 running-sum prompts x 8, every response exactly `--tokens` long, `ignore_eos`) on the run's
engine class (rollout/vllm_engine.VLLMEngine, without Ray) in three ways, in turn for each batch (ABCABC...) so
a drift of the machine's speed falls on all alike:
- the whole response in one call (what `stale4` samples: no partial rollout);
- a call per chunk (how `stale2+partial` was sampled before PartialRollout.settled);
- the first chunk, then the rest in one call (how it is sampled now).
No weights change between the chunks here: the two weight loads a step of that regime makes are timed apart
(`update_weights` of the model's own weights, median of `--batches` loads). Each variant's median over the
batches after `--warmup`, and its engine calls a batch, are reported.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_study_generate import ONE_STEP_BUDGET, batches, study_model
from benchmarks.common import bench_main

NAME = "bench_partial_chunks"
VARIANTS = {  # name -> PartialRollout.settled (None: a call per chunk); "no chunks" samples with Sampler.sample
    "whole response, one call (stale4)": "no chunks",
    "a call per chunk (before)": None,
    "first chunk, then the rest in one call (now)": 1,
}
BASELINE = "a call per chunk (before)"


def measure(args) -> dict:
    from reinforce_pro.rollout.sampler import PartialRollout, RolloutConfig, Sampler
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine

    with tempfile.TemporaryDirectory() as tmp:
        model = study_model(Path(tmp))
        work = batches(model, args.batches)
        engine = VLLMEngine(EngineConfig(model, dtype="bfloat16", max_model_len=96,
                                         cpu_max_batched_tokens=ONE_STEP_BUDGET))  # fmt: skip
        sampler = Sampler(engines=None, tokenizer=None, cfg=RolloutConfig(max_new_tokens=args.tokens))
        calls = [0]

        def sample(prompt_ids, sampling=None, engines=None):  # the engine in this process instead of Ray
            calls[0] += 1
            return engine.generate(prompt_ids, sampling)

        sampler.sample = sample
        sampling = {"temperature": 1.0, "max_tokens": args.tokens, "ignore_eos": True, "detokenize": False}
        runs = {name: {"batch_s": [], "calls": []} for name in VARIANTS}
        for batch in work:
            for name, settled in VARIANTS.items():
                before, start = calls[0], time.perf_counter()
                if settled == "no chunks":
                    out = sampler.sample(batch, sampling)
                else:
                    partial = PartialRollout(args.chunk, lambda chunk: 0, settled)
                    out, _ = sampler.sample_in_chunks(batch, partial, sampling)
                runs[name]["batch_s"].append(time.perf_counter() - start)
                runs[name]["calls"].append(calls[0] - before)
                assert all(len(g.token_ids) == args.tokens for g in out), "every response decodes exactly `tokens`"
        blob = (Path(model) / "model.safetensors").read_bytes()
        loads = []
        for _ in range(args.batches):
            start = time.perf_counter()
            engine.update_weights(blob)
            loads.append(time.perf_counter() - start)
    for run in runs.values():
        run.update(median_s=statistics.median(run["batch_s"][args.warmup :]), calls=run.pop("calls")[-1])
    return {"runs": runs, "weight_load_s": statistics.median(loads), "rows": len(work[0]),
            "prompt_tokens": len(work[0][0])}  # fmt: skip


def render(payload: dict, out_dir: Path) -> str:
    r, c, m = payload["results"], payload["config"], payload["machine"]
    base = r["runs"][BASELINE]["median_s"]
    lines = [
        f"Synchronous partial rollouts' generate phase: {r['rows']} responses of exactly {c['tokens']} tokens from "
        f"prompts of {r['prompt_tokens']} tokens, chunks of {c['chunk']}, the 2-layer running-sum model in a bf16 "
        f"engine without prefix caching (the study's); variants in turn for each batch, median of "
        f"{c['batches'] - c['warmup']} batches after {c['warmup']}; {m['cpu']} ({m['cpu_count']} cores), commit "
        f"{payload['commit'][:12]}",
        "",
        "| sampled as | engine calls / batch | median s / batch | against a call per chunk | batches (s) |",
        "|---|---|---|---|---|",
    ]
    for name, run in r["runs"].items():
        lines.append(
            f"| {name} | {run['calls']} | {run['median_s']:.2f} | {run['median_s'] / base - 1:+.0%} | "
            + ", ".join(f"{s:.2f}" for s in run["batch_s"])
            + " |"
        )
    lines += ["", f"One weight load (`update_weights` of the study model's weights): {r['weight_load_s'] * 1000:.0f} "
              "ms median; a `stale2+partial` step makes two."]  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out_dir / f"{payload['benchmark']}.md").write_text(text)
    return text


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", type=int, default=6, help="batches per variant")
    p.add_argument("--warmup", type=int, default=1, help="leading batches left out")
    p.add_argument("--tokens", type=int, default=64, help="tokens every response decodes (the study's 64 max)")
    p.add_argument("--chunk", type=int, default=16, help="tokens per chunk (the study's 16)")


def measured(args) -> tuple[dict, dict]:
    config = {"batches": args.batches, "warmup": args.warmup, "tokens": args.tokens, "chunk": args.chunk}
    return config, measure(args)


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
