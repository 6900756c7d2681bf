"""The long-response study's generate phase on a bare engine: what each engine setting costs, against the floor.

Runs on: CPU (the built-in tiny model of the running-sum task; nothing downloaded).
Takes:   ~3 minutes on 2 cores with the defaults (one engine start per variant, 6 batches each, the floor).

    python benchmarks/bench_study_generate.py                 # measure, write JSON, render the table
    python benchmarks/bench_study_generate.py --render FILE   # re-render from a JSON

A step of benchmarks/is_long_study.py samples 32 running-sum prompts x 8 (256 responses of ~62 tokens) from a
2-layer, 128-wide model in a bf16 engine; generation is most of the step. Here the run's engine class
(rollout/vllm_engine.VLLMEngine, without Ray) samples such batches with every response exactly `--tokens` long
(`ignore_eos`, so each variant decodes the same number of tokens), once per variant:
- the engine as the study's runs built it: prefill in chunks of 512 tokens, every output detokenized;
- `ids only`: the engine does not turn ids into text (the trainer decodes the ids it keeps itself);
- `prefill in one step`: a token budget that holds every prompt (the 256 prompts' ~5,600 tokens in one
  engine step instead of 11 chunks);
- `prefix caching`: the 8 samples of a prompt share its prefill.
The floor beside them is the same model, in fp32, decoding the same batch with its KV cache in a plain torch
loop (transformers' generate, sampling, no engine): what the arithmetic and torch's per-op cost allow. Each
variant's median over the batches after `--warmup`, and the engine steps a batch takes, are reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import RESULTS_DIR, render_saved, save_and_render  # noqa: E402

NAME = "bench_study_generate"
PROMPTS, SAMPLES = 32, 8  # the study's rollout batch: 32 prompts x 8 samples
ONE_STEP_BUDGET = 8192  # prefill tokens per engine step that hold the whole batch's prompts
BASELINE = "as the study ran: detokenized, prefill in chunks of 512"
VARIANTS = {  # name -> (EngineConfig fields, extra sampling keywords); each names every setting it compares
    BASELINE: ({}, {"detokenize": True}),
    "ids only": ({}, {"detokenize": False}),
    "detokenized, prefill in one step": ({"cpu_max_batched_tokens": ONE_STEP_BUDGET}, {"detokenize": True}),
    "ids only, prefill in one step": ({"cpu_max_batched_tokens": ONE_STEP_BUDGET}, {"detokenize": False}),
    "ids only, prefill in one step, prefix caching": (
        {"cpu_max_batched_tokens": ONE_STEP_BUDGET, "enable_prefix_caching": True},
        {"detokenize": False},
    ),
}


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


def time_variant(model: str, work: list, fields: dict, extra: dict, tokens: int, warmup: int) -> dict:
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine

    engine = VLLMEngine(EngineConfig(model, dtype="bfloat16", max_model_len=96, **fields))
    sampling = {"temperature": 1.0, "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True, **extra}
    seconds, steps, counter = [], [], count_engine_steps(engine)
    for batch in work:
        before, start = counter[0], time.perf_counter()
        out = engine.generate(batch, sampling)
        seconds.append(time.perf_counter() - start)
        steps.append(counter[0] - before)
        assert all(len(g.token_ids) == tokens for g in out), "every response decodes exactly `tokens` tokens"
    del engine
    kept = seconds[warmup:]
    return {"batch_s": seconds, "median_s": statistics.median(kept), "engine_steps": steps[-1],
            "ms_per_engine_step": 1000 * statistics.median(kept) / max(steps[-1], 1)}  # fmt: skip


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

    from reinforce_pro.workers.base import use_host_threads

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
        runs = {name: time_variant(model, work, fields, extra, args.tokens, args.warmup)
                for name, (fields, extra) in VARIANTS.items()}  # fmt: skip
        floor = time_floor(model, work, args.tokens, args.warmup)
    return {"runs": runs, "floor": floor, "prompt_tokens": len(work[0][0]), "rows": len(work[0])}


def render(payload: dict, out_dir: Path) -> str:
    r, c, m = payload["results"], payload["config"], payload["machine"]
    base = r["runs"][BASELINE]["median_s"]
    lines = [
        f"The long-response study's generate phase on a bare engine: {r['rows']} responses of exactly {c['tokens']} "
        f"tokens from {r['rows']} prompts of {r['prompt_tokens']} tokens ({PROMPTS} x {SAMPLES}), the 2-layer "
        f"running-sum model in bf16; median of {c['batches'] - c['warmup']} batches after {c['warmup']}; "
        f"{m['cpu']} ({m['cpu_count']} cores), commit {payload['commit'][:12]}",
        "",
        "| engine | median s / batch | against the first | engine steps / batch | ms / engine step | batches (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, run in r["runs"].items():
        lines.append(
            f"| {name} | {run['median_s']:.2f} | {run['median_s'] / base - 1:+.0%} | {run['engine_steps']} | "
            f"{run['ms_per_engine_step']:.1f} | " + ", ".join(f"{s:.2f}" for s in run["batch_s"]) + " |"
        )
    floor = r["floor"]
    batches = ", ".join(f"{s:.2f}" for s in floor["batch_s"])
    lines.append(
        f"| floor: the model alone (transformers' generate, fp32, KV cache) | {floor['median_s']:.2f} | "
        f"{floor['median_s'] / base - 1:+.0%} | - | {1000 * floor['median_s'] / c['tokens']:.1f} per token | "
        f"{batches} |"
    )
    text = "\n".join(lines) + "\n"
    (out_dir / f"{payload['benchmark']}.md").write_text(text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=6, help="batches per variant")
    parser.add_argument("--warmup", type=int, default=1, help="leading batches left out")
    parser.add_argument("--tokens", type=int, default=62, help="tokens every response decodes (the study's ~62)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR)
    parser.add_argument("--render", type=Path, default=None, help="re-render this JSON instead of measuring")
    args = parser.parse_args(argv)
    if args.render:
        return render_saved(args.render, render)
    config = {"batches": args.batches, "warmup": args.warmup, "tokens": args.tokens}
    return save_and_render(NAME, config, measure(args), args.output, render)


if __name__ == "__main__":
    raise SystemExit(main())
