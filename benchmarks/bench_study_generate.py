"""The long-response study's generate phase on a bare engine: what each engine setting costs, against the floor.

Runs on: CPU (the built-in tiny model of the running-sum task; nothing downloaded).
Takes:   ~3 minutes on 2 cores with the defaults (one engine start per variant, 6 batches each, the floor).

    python -m benchmarks.bench_study_generate                 # measure, write JSON, render the table
    python -m benchmarks.bench_study_generate --render FILE   # re-render from a JSON

A step of studies/is_long_study.py samples 32 running-sum prompts x 8 (256 responses of ~62 tokens) from a
2-layer, 128-wide model in a bf16 engine; generation is most of the step. Here the run's engine class
(rollout/vllm_engine.VLLMEngine, without Ray) samples such batches with every response exactly `--tokens` long
(`ignore_eos`, so every batch decodes the same number of tokens). Each engine setting starts its own engine:
- as the study's runs built it: prefill in chunks of 512 tokens;
- `prefill in one step`: a token budget that holds every prompt (the 256 prompts' ~5,600 tokens in one
  engine step instead of 11 chunks);
- with `prefix caching` besides: the 8 samples of a prompt share its prefill.
Each engine samples its batches in turn detokenized (what the run's engine did for every request) and as ids
only (what it does now unless stop strings need text), so a drift of the machine's speed falls on both.
The floor beside them is the same model, in fp32, decoding the same batch with its KV cache in a plain torch
loop (transformers' generate, sampling, no engine): what the arithmetic and torch's per-op cost allow. Each
variant's median over the batches after `--warmup`, and the engine steps a batch takes, are reported.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import bench_main

NAME = "bench_study_generate"
MODES = {"detokenized": True, "ids only": False}  # SamplingParams.detokenize
PROMPTS, SAMPLES = 32, 8  # the study's rollout batch: 32 prompts x 8 samples
ONE_STEP_BUDGET = 8192  # prefill tokens per engine step that hold the whole batch's prompts
ENGINES = {  # name -> EngineConfig fields
    "prefill in chunks of 512 (as the study ran)": {},
    "prefill in one step": {"cpu_max_batched_tokens": ONE_STEP_BUDGET},
    "prefill in one step, prefix caching": {"cpu_max_batched_tokens": ONE_STEP_BUDGET, "enable_prefix_caching": True},
}
BASELINE = ("prefill in chunks of 512 (as the study ran)", "detokenized")


def study_model(workdir: Path) -> str:
    """The running-sum task's model as the study builds it before its warm start (weights do not change what
    a step of decoding costs)."""
    from reinforce_pro.data import EMBEDDED_TASKS
    from reinforce_pro.models.tiny import build_tiny_model

    return str(build_tiny_model(workdir / "model", seed=0, num_layers=EMBEDDED_TASKS["running_sum"]().model_layers))


def batches(model: str, count: int) -> list[list[list[int]]]:
    """`count` batches of PROMPTS running-sum prompts' token ids, each repeated SAMPLES times."""
    from transformers import AutoTokenizer

    from reinforce_pro.data import running_sum
    from reinforce_pro.rollout.sampler import encode_prompt

    tok = AutoTokenizer.from_pretrained(model)
    records = running_sum.records(PROMPTS * count, seed=7)
    ids = [encode_prompt(tok, r["input"], 32) for r in records]
    return [[p for p in ids[b * PROMPTS : (b + 1) * PROMPTS] for _ in range(SAMPLES)] for b in range(count)]


def time_engine(model: str, work: list, fields: dict, tokens: int, warmup: int) -> dict:
    """One engine, its batches sampled detokenized and as ids only in turn (ABAB...), so a drift of the machine's
    speed during the run falls on both alike."""
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine

    engine = VLLMEngine(EngineConfig(model, dtype="bfloat16", max_model_len=96, **fields))
    sampling = {"temperature": 1.0, "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True}
    runs = {mode: {"batch_s": [], "steps": []} for mode in MODES}
    counter = count_engine_steps(engine)
    for batch in work:
        for mode, detokenize in MODES.items():
            before, start = counter[0], time.perf_counter()
            out = engine.generate(batch, {**sampling, "detokenize": detokenize})
            runs[mode]["batch_s"].append(time.perf_counter() - start)
            runs[mode]["steps"].append(counter[0] - before)
            assert all(len(g.token_ids) == tokens for g in out), "every response decodes exactly `tokens` tokens"
    del engine
    for run in runs.values():
        kept = run["batch_s"][warmup:]
        run.update(median_s=statistics.median(kept), engine_steps=run.pop("steps")[-1])
        run["ms_per_engine_step"] = 1000 * run["median_s"] / max(run["engine_steps"], 1)
    return runs


def count_engine_steps(engine) -> list[int]:
    """A one-element counter of the engine steps that ran the model (the in-process engine core's step_fn
    wrapped; CPU engines run their core in this process)."""
    core, counter = engine.llm.llm_engine.engine_core.engine_core, [0]
    step = core.step_fn

    def counted():
        outputs, executed = step()
        counter[0] += bool(executed)
        return outputs, executed

    core.step_fn = counted
    return counter


def time_floor(model: str, work: list, tokens: int, warmup: int) -> dict:
    """The same batches decoded by the model alone: transformers' generate with its KV cache, fp32, sampling."""
    import torch
    from transformers import AutoModelForCausalLM

    from reinforce_pro.procs import use_host_threads

    use_host_threads()
    net = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    seconds = []
    for batch in work:
        ids = torch.tensor(batch)  # every running-sum prompt has the same length: no padding
        start = time.perf_counter()
        with torch.no_grad():
            out = net.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=tokens,
                               min_new_tokens=tokens, pad_token_id=0)  # fmt: skip
        seconds.append(time.perf_counter() - start)
        assert out.shape[1] - ids.shape[1] == tokens
    return {"batch_s": seconds, "median_s": statistics.median(seconds[warmup:])}


def measure(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        model = study_model(Path(tmp))
        work = batches(model, args.batches)
        runs = {name: time_engine(model, work, fields, args.tokens, args.warmup) for name, fields in ENGINES.items()}
        floor = time_floor(model, work, args.tokens, args.warmup)
    return {"runs": runs, "floor": floor, "prompt_tokens": len(work[0][0]), "rows": len(work[0])}


def render(payload: dict, out_dir: Path) -> str:
    r, c, m = payload["results"], payload["config"], payload["machine"]
    base = r["runs"][BASELINE[0]][BASELINE[1]]["median_s"]
    lines = [
        f"The long-response study's generate phase on a bare engine: {r['rows']} responses of exactly {c['tokens']} "
        f"tokens from {r['rows']} prompts of {r['prompt_tokens']} tokens ({PROMPTS} x {SAMPLES}), the 2-layer "
        f"running-sum model in bf16; each engine's batches detokenized and as ids only in turn, median of "
        f"{c['batches'] - c['warmup']} batches after {c['warmup']}; {m['cpu']} ({m['cpu_count']} cores), commit "
        f"{payload['commit'][:12]}",
        "",
        "| engine | output | median s / batch | against the first | engine steps / batch | ms / engine step "
        "| batches (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, modes in r["runs"].items():
        for mode, run in modes.items():
            lines.append(
                f"| {name} | {mode} | {run['median_s']:.2f} | {run['median_s'] / base - 1:+.0%} | "
                f"{run['engine_steps']} | {run['ms_per_engine_step']:.1f} | "
                + ", ".join(f"{s:.2f}" for s in run["batch_s"])
                + " |"
            )
    floor = r["floor"]
    batches = ", ".join(f"{s:.2f}" for s in floor["batch_s"])
    lines.append(
        f"| floor: the model alone (transformers' generate, fp32, KV cache) | ids | {floor['median_s']:.2f} | "
        f"{floor['median_s'] / base - 1:+.0%} | - | {1000 * floor['median_s'] / c['tokens']:.1f} per token | "
        f"{batches} |"
    )
    text = "\n".join(lines) + "\n"
    (out_dir / f"{payload['benchmark']}.md").write_text(text)
    return text


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", type=int, default=6, help="batches per variant")
    p.add_argument("--warmup", type=int, default=1, help="leading batches left out")
    p.add_argument("--tokens", type=int, default=62, help="tokens every response decodes (the study's ~62)")


def measured(args) -> tuple[dict, dict]:
    return {"batches": args.batches, "warmup": args.warmup, "tokens": args.tokens}, measure(args)


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
