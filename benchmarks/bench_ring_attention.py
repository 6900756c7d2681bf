"""What ring attention (--ring_attn_size) saves per rank, and what it costs.

Runs on: CPU (gloo between processes on this host), no extra packages.
Takes:   ~2 minutes on 2 cores with the defaults.

    python -m benchmarks.bench_ring_attention                 # measure, write JSON, render the table
    python -m benchmarks.bench_ring_attention --render FILE   # re-render from a JSON

One forward + backward of the response log-probs of a causal LM (a Qwen2 of `--layers` x `--hidden`, built
locally) on a micro-batch of `--rows` sequences of `--seq` tokens (the last half of each the response), packed
(--packing_samples: one bin per sequence here, all being as long as the longest), computed:
- "sdpa": one process, transformers' sdpa attention (its math kernel on CPU keeps the attention weights);
- "ring 1": one process, the ring's attention function with a ring of one (no hops: the per-rank baseline);
- "ring 2": two processes, each holding half of the row, key / value blocks passed over gloo.
Per rank: the bytes autograd saves for the backward pass (every tensor given to `save_for_backward`, counted
by `torch.autograd.graph.saved_tensors_hooks`: the activation memory, exactly, without allocator noise) and the
wall time of the forward + backward (median of `--reps`, after one warm-up). The two ring processes share the
host's 2 cores, so "ring 2" wall time is the cost of the hops and of two processes on 2 cores, not a speed-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import bench_main

NAME = "bench_ring_attention"


def build_model(path: Path, layers: int, hidden: int, heads: int, vocab: int, max_len: int) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads // 2, max_position_embeddings=max_len,
                         tie_word_embeddings=True)  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(path)
    return str(path)


def batch(rows: int, seq: int, vocab: int):
    """`rows` sequences of `seq` tokens, the last half of each the response."""
    import torch

    gen = torch.Generator().manual_seed(0)
    return torch.randint(10, vocab, (rows, seq), generator=gen), torch.ones(rows, seq, dtype=torch.long), seq // 2


def saved_bytes_and_time(step) -> tuple[int, float]:
    """(bytes saved for backward, seconds) of `step()`, which runs a forward and returns the loss."""
    import torch

    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step()
    loss.backward()
    return total, time.perf_counter() - start


def measure_one(mode: str, model_dir: str, rows: int, seq: int, reps: int, rank=0, size=1) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.logprobs import response_log_probs
    from reinforce_pro.models.ring_attention import register, ring_response_log_probs

    register()
    attn = "sdpa" if mode == "sdpa" else "ring"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn)
    seqs, mask, response = batch(rows, seq, model.config.vocab_size)

    def step():
        if mode == "sdpa":
            lp, _ = response_log_probs(model, seqs, mask, response, packed=True)
        else:
            lp, _ = ring_response_log_probs(model, seqs, mask, response, rank, list(range(size)))
        return lp.sum()

    runs = [saved_bytes_and_time(step) for _ in range(reps + 1)][1:]
    return {"saved_bytes": runs[0][0], "seconds": statistics.median(t for _, t in runs)}


def _ring_rank(rank: int, size: int, init: str, out_dir: str, model_dir: str, rows: int, seq: int, reps: int):
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        result = measure_one("ring", model_dir, rows, seq, reps, rank, size)
        Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def measure_ring(size: int, model_dir: str, rows: int, seq: int, reps: int) -> dict:
    import json

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        init = f"file://{out_dir}/rendezvous"
        mp.start_processes(_ring_rank, args=(size, init, out_dir, model_dir, rows, seq, reps), nprocs=size,
                           start_method="spawn")  # fmt: skip
        ranks = [json.loads(Path(out_dir, f"{r}.json").read_text()) for r in range(size)]
    return {"saved_bytes": max(r["saved_bytes"] for r in ranks), "seconds": max(r["seconds"] for r in ranks)}


def render(payload: dict, out_dir: Path) -> str:
    res, cfg = payload["results"], payload["config"]
    base = res["ring 1"]["saved_bytes"]
    lines = [
        f"Forward + backward of the response log-probs, {cfg['rows']} packed sequences of {cfg['seq']} tokens, a "
        f"Qwen2 of {cfg['layers']} layers x {cfg['hidden']}, median of {cfg['reps']}; per rank",
        "",
        "| attention | ranks | saved for backward (MiB) | vs ring of 1 | seconds |",
        "|---|---|---|---|---|",
    ]
    for mode, ranks in (("sdpa", 1), ("ring 1", 1), ("ring 2", 2)):
        r = res[mode]
        lines.append(f"| {mode} | {ranks} | {r['saved_bytes'] / 2**20:.1f} | {r['saved_bytes'] / base:.2f}x | "
                     f"{r['seconds']:.2f} |")  # fmt: skip
    m = payload["machine"]
    lines.append(f"\n_{m['cpu']} ({m['cpu_count']} cores), torch {m['torch']}, commit {payload['commit'][:12]}._")
    text = "\n".join(lines)
    (out_dir / f"{NAME}.md").write_text(text + "\n")
    return text


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=2, help="sequences in the micro-batch")
    p.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)


def measured(args) -> tuple[dict, dict]:
    config = {k: getattr(args, k) for k in ("rows", "seq", "layers", "hidden", "reps")}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "model", args.layers, args.hidden, 8, 2048, args.seq)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        results = {
            "sdpa": measure_one("sdpa", model_dir, args.rows, args.seq, args.reps),
            "ring 1": measure_ring(1, model_dir, args.rows, args.seq, args.reps),
            "ring 2": measure_ring(2, model_dir, args.rows, args.seq, args.reps),
        }
    return config, results


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
