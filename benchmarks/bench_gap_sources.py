"""Where the engine/trainer log-prob gap comes from: each source of it alone, on the same sampled tokens.

Runs on: CPU, 2 cores, nothing else running; the `models` extra for the SmolLM2-135M case.
Takes:   ~4 minutes with the defaults (both cases, one seed).

    python -m benchmarks.bench_gap_sources                  # measure, write JSON, render the table
    python -m benchmarks.bench_gap_sources --render FILE    # re-render from a JSON

An fp32 vLLM engine samples the responses; every row of the table then computes the log-probs of exactly those
tokens two ways that differ in one thing, and reports |a - b| over the response tokens (mean, p99, max) and the
mean of a - b (its bias). The reference is an HF forward in fp32 of one row at a time (no padding). The rows:
- engine kernels, fp32: the engine's own sampled (decode) log-probs against the reference;
- decode against prefill, fp32 engine: the engine's sampled log-probs against its own prefill of the same tokens;
- batching and padding, trainer fp32: rows in one left/right-padded batch, as the trainer's forward sees them;
- weights rounded to bf16: the reference's forward on weights rounded to bf16 (what a bf16 sync hands the
  engine), computed in fp32;
- bf16 compute, trainer: an HF bf16 forward against the fp32 forward of the same bf16-rounded weights;
- the LM head in bf16, trainer: an HF bf16 forward against the same with an fp32 head (`--fp32_lm_head`);
- and the whole gaps a run sees (prefill on the engine side): bf16 engine against fp32 trainer (the main job as
  it ships), bf16 engine against bf16 trainer, and both with `--fp32_lm_head`.

Cases: `embedded`, the main job's model after its warm start, on 256 arithmetic prompts, 6 new tokens each;
`smollm2`, SmolLM2-135M-Instruct on 64 chat-templated questions, 24 new tokens each.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.bench_opd_reward_error import engine_prefill, models, prefill, row_log_probs, sample
from benchmarks.common import bench_main, scratch_dir, write_table

NAME = "bench_gap_sources"
# (row, a, b): the two computations a row compares, by their keys in `computed`
ROWS = [
    ("engine kernels, fp32 (decode)", "engine fp32 decode", "reference"),
    ("decode against prefill, fp32 engine", "engine fp32 decode", "engine fp32 prefill"),
    ("batching and padding, trainer fp32", "trainer fp32 batched", "reference"),
    ("weights rounded to bf16 (fp32 compute)", "bf16 weights fp32 compute", "reference"),
    ("bf16 compute, trainer (same bf16 weights)", "trainer bf16", "bf16 weights fp32 compute"),
    ("LM head in bf16, trainer", "trainer bf16", "trainer bf16 fp32 head"),
    ("whole gap: bf16 engine, fp32 trainer (the main job)", "engine bf16 prefill", "reference"),
    ("whole gap: bf16 engine, bf16 trainer", "engine bf16 prefill", "trainer bf16"),
    ("whole gap: both bf16 with --fp32_lm_head", "engine bf16 fp32 head prefill", "trainer bf16 fp32 head"),
]


def hf_rows(path: str, rows: list[tuple[list[int], list[int]]], dtype, fp32_head=False, round_bf16=False) -> list:
    """Each row's response-token log-probs from an HF forward of prompt + response, one row at a time. `round_bf16`:
    the weights rounded to bf16 and back (computed in `dtype`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.fp32_head import install_fp32_head

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    if round_bf16:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
    if fp32_head:
        install_fp32_head(model)
    return row_log_probs(model, rows)


def hf_batched(path: str, rows: list[tuple[list[int], list[int]]], micro: int = 16) -> list:
    """The trainer's layout: prompts left-padded, responses right-padded, `micro` rows a forward, position ids from
    the mask (models/logprobs.py), fp32."""
    import torch
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.logprobs import action_log_probs, forward_logits

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(rows), micro):
            chunk = rows[i : i + micro]
            width_p, width_r = max(len(p) for p, _ in chunk), max(len(r) for _, r in chunk)
            seq = torch.zeros(len(chunk), width_p + width_r, dtype=torch.long)
            mask = torch.zeros_like(seq)
            for j, (p, r) in enumerate(chunk):
                seq[j, width_p - len(p) : width_p + len(r)] = torch.tensor(p + r)
                mask[j, width_p - len(p) : width_p + len(r)] = 1
            lp, _ = action_log_probs(forward_logits(model, seq, mask), seq, width_r)
            out += [lp[j, : len(r)] for j, (_, r) in enumerate(chunk)]
    return out


def gaps(case: str, seed: int) -> dict:
    import torch

    with scratch_dir("gap_sources_") as work:
        student, _, prompts, new_tokens = models(case, Path(work))
        sampler, kept, rows, max_len = sample(student, prompts, new_tokens, "float32", seed)
        computed = {
            "engine fp32 decode": [torch.tensor(g.log_probs, dtype=torch.float32) for _, g in kept],
            "engine fp32 prefill": prefill(sampler, rows),
        }
        del sampler
        computed["engine bf16 prefill"] = engine_prefill(student, rows, "bfloat16", max_len, seed, "scorer")
        computed["engine bf16 fp32 head prefill"] = engine_prefill(
            student, rows, "bfloat16", max_len, seed, "scorer", fp32_head=True
        )
        computed["reference"] = hf_rows(student, rows, torch.float32)
        computed["trainer fp32 batched"] = hf_batched(student, rows)
        computed["bf16 weights fp32 compute"] = hf_rows(student, rows, torch.float32, round_bf16=True)
        computed["trainer bf16"] = hf_rows(student, rows, torch.bfloat16)
        computed["trainer bf16 fp32 head"] = hf_rows(student, rows, torch.bfloat16, fp32_head=True)
    cat = {k: torch.cat(v) for k, v in computed.items()}
    out = {"tokens": int(cat["reference"].numel()), "responses": len(rows), "rows": {}}
    for name, a, b in ROWS:
        diff = cat[a] - cat[b]
        diff = diff[torch.isfinite(diff)].double()
        size = diff.abs()
        out["rows"][name] = {
            "a": a, "b": b, "tokens": int(diff.numel()), "mean": float(size.mean()),
            "p99": float(size.quantile(0.99)), "max": float(size.max()), "bias": float(diff.mean()),
        }  # fmt: skip
    return out


def render(payload: dict, out_dir: Path) -> str:
    lines = ["The engine/trainer log-prob gap by source: |a - b| over the same sampled response tokens (nats)"]
    for case, by_seed in payload["results"].items():
        seeds = sorted(by_seed, key=int)
        first = by_seed[seeds[0]]
        lines += [
            "",
            f"**{case}**: {first['responses']} responses, {first['tokens']} tokens a seed; seeds {', '.join(seeds)} "
            "(mean |a - b| of each seed; p99, max and bias of the first)",
            "",
            "| source | a | b | mean by seed | p99 | max | bias |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, row in first["rows"].items():
            means = ", ".join(f"{by_seed[s]['rows'][name]['mean']:.1e}" for s in seeds)
            lines.append(f"| {name} | {row['a']} | {row['b']} | {means} | {row['p99']:.1e} | {row['max']:.1e} | "
                         f"{row['bias']:+.1e} |")  # fmt: skip
    return write_table(payload, lines, out_dir, NAME)


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", nargs="*", default=["embedded", "smollm2"], choices=["embedded", "smollm2"])
    p.add_argument("--seeds", type=int, nargs="*", default=[0])


def measured(args) -> tuple[dict, dict]:
    config = {"cases": args.cases, "seeds": args.seeds}
    return config, {case: {str(s): gaps(case, s) for s in args.seeds} for case in args.cases}


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
