"""Where the train phase of a real model's RL step goes, against its roofline.

Runs on: CPU, with the `models` extra for SmolLM2-135M-Instruct (prepared once under ~/.cache/reinforce_pro).
Takes:   ~13 minutes on 2 cores with the defaults (6 variants x 6 steps, a profiled step, the AdamW timings).

    python -m benchmarks.bench_train_phase                 # measure, write JSON, render the table
    python -m benchmarks.bench_train_phase --render FILE   # re-render from a JSON

The policy worker of a run (workers/policy.PolicyWorker: DeepSpeed, AdamW, the policy loss), built in this
process as one rank, trains on batches shaped like bench_peers' W3 step: 32 rows of a chat-templated prompt
(~36 tokens) and a response of 16-64 tokens (uniform: mean ~47, as W3's rollouts; W3's own have more at 64, its
cap), rows ordered by length as the trainer orders them, micro-batches of 16, one optimizer step per batch,
fp32, ZeRO stage 0 — what `time/train` of a W3 step covers. It reports:
- seconds per optimizer step (median of `--steps`, after one warm-up step), beside the roofline
  6 x matmul parameters x trained tokens / the machine's fp32 GEMM rate (a square GEMM, as bench_peers);
- the same step with each optimisation undone alone, and with options added (--packing_samples in one row or
  in bins, the element-wise ops compiled), alternating with the step above on the same worker;
- a torch-profiler breakdown of one step: self time by kind of op (GEMM, attention, the optimizer's step,
  element-wise, copies, ...), the GEMMs' own rate (their FLOPs / their time) and the time no op accounts for
  (Python, DeepSpeed and autograd bookkeeping);
- the 15 ops with the most self time;
- one AdamW step over the model's parameters with each of torch's implementations (for-loop, foreach, fused).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from unittest import mock

from benchmarks.common import PACKAGED_MODELS, attention_kernel, bench_main

NAME = "bench_train_phase"
MODEL = PACKAGED_MODELS / "smollm2-135m-instruct"  # where the recipes keep it
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv"}
KINDS = [
    "GEMM",
    "attention",
    "optimizer step",
    "vocabulary-wide (log-probs)",
    "log-prob / loss",
    "element-wise",
    "copy / fill / views",
    "other ops",
]


LOG_PROB_OPS = ("logsumexp", "gather", "log_softmax", "_log_softmax", "softmax", "_softmax", "scatter")
COPY_OPS = {"copy_", "fill_", "zero_", "zeros", "zeros_like", "empty", "empty_like", "empty_strided", "clone", "to",
            "_to_copy", "contiguous", "cat", "new_zeros", "new_empty", "full", "ones_like", "resize_", "as_strided",
            "slice", "select", "view", "reshape", "_reshape_alias", "expand", "transpose", "t", "permute",
            "unsqueeze", "squeeze", "narrow", "split", "detach"}  # fmt: skip


def op_kind(name: str) -> str:
    op = name.removeprefix("aten::")
    if name in GEMM_OPS:
        return "GEMM"
    if "scaled_dot_product" in op or "flash_attention" in op:
        return "attention"
    if name.startswith("aten::") and op.startswith(LOG_PROB_OPS):
        return "log-prob / loss"
    if name.startswith("aten::") and op in COPY_OPS:
        return "copy / fill / views"
    if name.startswith("aten::"):
        return "element-wise"  # mul, add, silu, rsqrt, pow, mean, embedding_dense_backward, ...
    return "other ops"


def experience_batch(rows: int, prompt: int, max_response: int, vocab: int, seed: int):
    """One rollout batch as the trainer hands it to the policy: left-padded prompts of prompt-6..prompt tokens,
    right-padded responses of max_response/4..max_response, advantages of +-1, no old log-probs (one epoch)."""
    import torch

    from reinforce_pro.experience import Experience

    gen = torch.Generator().manual_seed(seed)
    seq, mask = padded_batch(rows, prompt, max_response, vocab, gen)
    action_mask = mask[:, prompt:].bool()
    advantages = (torch.randint(0, 2, (rows, 1), generator=gen).float() * 2 - 1) * action_mask
    return Experience(
        sequences=seq * mask, attention_mask=mask, action_mask=action_mask, old_log_probs=None,
        rollout_log_probs=torch.full(action_mask.shape, -1.0), advantages=advantages, returns=advantages,
        rewards=advantages[:, 0],
    )  # fmt: skip


def padded_batch(rows: int, prompt: int, max_response: int, vocab: int, gen):
    """(rows, prompt + max_response) token ids and mask: left-padded prompts of prompt-6..prompt tokens,
    right-padded responses of max_response/4..max_response, drawn from the torch Generator `gen`."""
    import torch

    seq = torch.randint(10, vocab, (rows, prompt + max_response), generator=gen)
    mask = torch.ones_like(seq)
    for i in range(rows):
        p = int(torch.randint(prompt - 6, prompt + 1, (1,), generator=gen))
        r = int(torch.randint(max_response // 4, max_response + 1, (1,), generator=gen))
        mask[i, : prompt - p] = 0
        mask[i, prompt + r :] = 0
    return seq * mask, mask


def build_worker(model: Path, micro: int, rendezvous: Path):
    from reinforce_pro.workers.configs import DistInfo, ForwardConfig, OptimConfig
    from reinforce_pro.workers.policy import PolicyLossConfig, PolicyWorker

    opt = OptimConfig(learning_rate=1e-6, lr_scheduler="constant", lr_warmup_ratio=0.0, total_steps=1000,
                      zero_stage=0, param_dtype="fp32", micro_batch_size=micro, grad_accum_steps=1)  # fmt: skip
    dist = DistInfo(init_method=f"file://{rendezvous}")
    return PolicyWorker(str(model), opt, PolicyLossConfig(), dist, seed=0, forward=ForwardConfig("sdpa", micro))


def train_step(worker, batch, micro: int) -> float:
    micro_batches = [batch.select(slice(i, i + micro)) for i in range(0, len(batch), micro)]
    tokens = float(batch.action_mask.sum())
    start = time.perf_counter()
    worker.train_minibatch(micro_batches, global_tokens=tokens, global_seqs=float(len(batch)))
    return time.perf_counter() - start


def profile_step(worker, batch, micro: int, vocab: int) -> dict:
    """Self time (s) by kind of op over one step, the optimizer step's own time, the GEMMs' FLOPs. An op that
    is no GEMM and reads a (..., vocabulary) tensor is the log-prob computation over the LM head's logits
    (logsumexp, gather and their gradients): "vocabulary-wide"."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_flops=True, record_shapes=True) as prof:
        wall = train_step(worker, batch, micro)
    by_kind, by_op, gemm_flops, gemm_shapes = defaultdict(float), defaultdict(float), 0.0, defaultdict(int)
    for e in prof.events():
        self_s = e.self_cpu_time_total / 1e6
        parent, in_optimizer = e.cpu_parent, False
        while parent is not None:  # AdamW's per-parameter ops are element-wise, but they belong to its step
            in_optimizer |= parent.name.startswith("Optimizer.step")
            parent = parent.cpu_parent
        kind = op_kind(e.name)
        if in_optimizer or e.name.startswith("Optimizer.step"):
            kind = "optimizer step"
        elif kind != "GEMM" and any(isinstance(shape, list) and shape[-1:] == [vocab] for shape in e.input_shapes):
            kind = "vocabulary-wide (log-probs)"
        by_kind[kind] += self_s
        by_op[(e.name, kind)] += self_s
        if e.name == "aten::mm":
            gemm_shapes[tuple(map(tuple, e.input_shapes[:2]))] += 1
        if e.name in GEMM_OPS:
            gemm_flops += e.flops or 0.0
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:15]
    return {"wall_s": wall, "by_kind_s": {k: by_kind.get(k, 0.0) for k in KINDS}, "gemm_flops": gemm_flops,
            "gemm_alone_s": gemms_alone_s(gemm_shapes),
            "top_ops": [{"op": name, "self_s": s, "kind": kind} for (name, kind), s in top]}  # fmt: skip


def gemms_alone_s(shapes: dict[tuple, int], reps: int = 3) -> float:
    """The step's matrix products (aten::mm, by shape and count) timed alone, each the best of `reps` on fresh
    contiguous operands: what its GEMMs cost at their own shapes with nothing else running, the ceiling a
    faster step around them could reach (the square GEMM's rate is not reached by (1,600 x 576) x (576 x 576))."""
    import torch

    total = 0.0
    for (a_shape, b_shape), count in shapes.items():
        a, b = torch.randn(a_shape), torch.randn(b_shape)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
        total += best * count
    return total


ADAMW_VARIANTS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def use_adamw(optimizer, impl: str) -> None:
    """Switch a torch AdamW between its implementations; each reads the same state."""
    for group in optimizer.param_groups:
        group.update(ADAMW_VARIANTS[impl] | {k: False for k in ("foreach", "fused") if k not in ADAMW_VARIANTS[impl]})


@contextmanager
def swapped_adamw(optimizer, impl: str, back: str):
    use_adamw(optimizer, impl)
    try:
        yield
    finally:
        use_adamw(optimizer, back)


@contextmanager
def packed_forwards(worker, kernel: str):
    """The worker's forwards packed (--packing_samples), its model attending with `kernel` meanwhile: the
    trainer loads sdpa as sdpa_varlen under --packing_samples (models/varlen_attention.py), which packs one
    row; plain sdpa packs bins of the longest row."""
    from reinforce_pro.models.varlen_attention import register

    register()
    with (
        mock.patch.object(worker, "forward", replace(worker.forward, packing_samples=True)),
        attention_kernel(worker.engine.module.config, kernel),
    ):
        yield


@contextmanager
def compiled_elementwise(worker):
    """The decoder's element-wise pieces compiled by torch.compile, so that Inductor fuses each into one or two
    loops: every RMSNorm, every MLP (SiLU times the up projection; its products stay torch's GEMMs) and the
    rotary embedding's application (rotate_half's cat). Attention is left out: sdpa_varlen loops over the
    micro-batch's sequences, which would recompile for every new set of lengths. One compiled graph serves
    every layer (dynamic shapes, the parameters as inputs); compiling costs ~11 s on the first step."""
    import torch

    model = worker.engine.module
    modeling = sys.modules[type(model).__module__]  # transformers' modeling file of this architecture
    modules = [m for m in model.modules() if type(m).__name__.endswith(("RMSNorm", "MLP"))]
    rotary = modeling.apply_rotary_pos_emb
    modeling.apply_rotary_pos_emb = torch.compile(rotary, dynamic=True)  # Dynamo's cache outlives the wrapper
    for module in modules:
        module.compile(dynamic=True)
    try:
        yield
    finally:
        for module in modules:
            module._compiled_call_impl = None  # what Module.compile set: the module's own forward again
        modeling.apply_rotary_pos_emb = rotary


@contextmanager
def packed_and_compiled(worker):
    with packed_forwards(worker, "sdpa_varlen"), compiled_elementwise(worker):
        yield


def autograd_lp(logits, targets):
    """models/logprobs._TokenLogProbs as autograd differentiates it: logsumexp and gather."""
    import torch

    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def sliced_head_logits(model, sequences, attention_mask, predicting=None):
    """models/logprobs.forward_logits before b1287cb: the head over the last `predicting` + 1 positions (HF's
    logits_to_keep as a count), the last position's logits sliced off (its backward zero-fills them)."""
    from reinforce_pro.models.logprobs import position_ids_from_mask

    out = model(input_ids=sequences, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask),
                use_cache=False, logits_to_keep=predicting + 1)  # fmt: skip
    return out.logits[:, :-1]


def adamw_step_s(model_dir: Path, reps: int = 3) -> dict[str, float]:
    """Seconds of one AdamW step over the model's parameters (random gradients), per implementation: torch's
    default on CPU (a loop over parameters), its multi-tensor `foreach` path, and its fused kernel; the median
    of `reps` steps after a warm-up step that creates the state."""
    import torch
    from transformers import AutoModelForCausalLM

    params = list(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    out = {}
    for name, kwargs in ADAMW_VARIANTS.items():
        opt = torch.optim.AdamW(params, lr=1e-6, betas=(0.9, 0.95), **kwargs)
        opt.step()
        seconds = []
        for _ in range(reps):
            start = time.perf_counter()
            opt.step()
            seconds.append(time.perf_counter() - start)
        out[name] = statistics.median(seconds)
        del opt
    return out


def measure(args) -> dict:
    import torch
    from transformers import AutoConfig

    from benchmarks.bench_peers import gemm_peak_gflops, matmul_params
    from reinforce_pro.models import logprobs
    from reinforce_pro.models.packaged import prepare
    from reinforce_pro.trainer.ppo_trainer import length_grouped

    model = prepare("smollm2-135m-instruct", MODEL) if args.model is None else Path(args.model)
    vocab = AutoConfig.from_pretrained(model).vocab_size
    batch = experience_batch(args.rows, args.prompt_tokens, args.max_response_tokens, vocab, seed=0)
    # as the trainer orders a mini-batch (one rank): rows sorted by length, so that each micro-batch holds rows
    # of similar length, which the worker then cuts to their own longest (Experience.trim_padding)
    batch = batch.select(length_grouped(torch.arange(args.rows), batch.attention_mask.sum(-1), ranks=1))
    with tempfile.TemporaryDirectory() as tmp:
        worker = build_worker(model, args.micro, Path(tmp) / "rendezvous")
        peak = gemm_peak_gflops()
        optimizer = getattr(worker.engine.optimizer, "optimizer", worker.engine.optimizer)  # under ZeRO's wrapper
        group = optimizer.param_groups[0]
        adamw_impl = "fused" if group.get("fused") else "foreach" if group.get("foreach") else "for-loop"
        train_step(worker, batch, args.micro)  # warm-up: allocator, AdamW's state
        undone = {  # each of the train phase's optimisations undone alone, on the same worker and state
            "torch's for-loop AdamW": partial(swapped_adamw, optimizer, "for-loop", adamw_impl),
            "autograd's log-prob backward": partial(mock.patch.object, logprobs._TokenLogProbs, "apply", autograd_lp),
            "the LM head on num_actions + 1 positions, sliced": partial(
                mock.patch.object, logprobs, "forward_logits", sliced_head_logits
            ),
            # not optimisations of the step but a flag W3's command does not pass: padding-free forwards, as
            # the trainer runs them (sdpa_varlen: one row) and in bins (eager, or a model without logits_to_keep)
            "(added) --packing_samples": partial(packed_forwards, worker, "sdpa_varlen"),
            "(added) --packing_samples in bins of the longest row": partial(packed_forwards, worker, "sdpa"),
            # not an option of the trainer: whether fusing the element-wise ops would pay
            "(added) --packing_samples, norms / MLP / rotary compiled": partial(packed_and_compiled, worker),
        }
        for variant in undone.values():  # each variant's own warm-up (the compiled one compiles here)
            with variant():
                train_step(worker, batch, args.micro)
        seconds, without = [], defaultdict(list)
        for _ in range(args.steps):  # alternating: the run's step, then each variant
            seconds.append(train_step(worker, batch, args.micro))
            for name, variant in undone.items():
                with variant():
                    without[name].append(train_step(worker, batch, args.micro))
        profiled = profile_step(worker, batch, args.micro, vocab)
        del worker, undone
    adamw = adamw_step_s(model)
    tokens = int(batch.attention_mask.sum())
    params = matmul_params(model)
    return {
        "step_s": seconds,
        "median_step_s": statistics.median(seconds),
        "median_step_s_without": {name: statistics.median(v) for name, v in without.items()},
        "gemm_peak_gflops": peak,
        "matmul_params": params,
        "trained_tokens": tokens,
        "response_tokens": int(batch.action_mask.sum()),
        "roofline_s": 6 * params * tokens / (best_gflops(peak, profiled) * 1e9),
        "profile": profiled,
        "adamw_step_s": adamw,
        "adamw_impl": adamw_impl,
        "torch_threads": torch.get_num_threads(),
    }


def best_gflops(square_gflops: float, profile: dict) -> float:
    """The machine's fp32 GEMM rate for the roofline: the better of the square GEMM and the step's own products
    timed alone. One square-GEMM measurement can come out low (173 GFLOP/s in a run whose products alone ran at
    277), and a roofline below what the step's GEMMs reach says nothing."""
    return max(square_gflops, profile["gemm_flops"] / profile["gemm_alone_s"] / 1e9)


def render(payload: dict, out_dir: Path) -> str:
    r, c, m = payload["results"], payload["config"], payload["machine"]
    p = r["profile"]
    rate = best_gflops(r["gemm_peak_gflops"], p)
    roofline = 6 * r["matmul_params"] * r["trained_tokens"] / (rate * 1e9)
    gemm_s = p["by_kind_s"]["GEMM"]
    accounted = sum(p["by_kind_s"].values())
    lines = [
        f"Train phase of one RL step, {c['model_name']}: {c['rows']} rows ({r['trained_tokens']} tokens, "
        f"{r['response_tokens']} of them response), micro-batches of {c['micro']}, fp32, ZeRO 0; {m['cpu']} "
        f"({m['cpu_count']} cores, {r['torch_threads']} torch threads), commit {payload['commit'][:12]}",
        "",
        "| step (median of {}) | roofline 6 x {:.1f}M x {} tokens / {:.0f} GFLOP/s | step / roofline |".format(
            len(r["step_s"]), r["matmul_params"] / 1e6, r["trained_tokens"], rate
        ),
        "|---|---|---|",
        f"| {r['median_step_s']:.2f} s | {roofline:.2f} s | {r['median_step_s'] / roofline:.2f}x |",
        "",
        f"(the GEMM rate: the better of a 2,048-square GEMM, {r['gemm_peak_gflops']:.0f} GFLOP/s, and the step's "
        f"products timed alone, {p['gemm_flops'] / p['gemm_alone_s'] / 1e9:.0f} GFLOP/s)",
        "",
        "The same step with one optimisation undone, or (added) one option turned on (alternating with the step "
        "above, same worker and state):",
        "",
        "| undone / (added) | median step | against the step above | step / roofline |",
        "|---|---|---|---|",
        *(
            f"| {name} | {v:.2f} s | {v - r['median_step_s']:+.2f} s ({v / r['median_step_s'] - 1:+.1%}) | "
            f"{v / roofline:.2f}x |"
            for name, v in r["median_step_s_without"].items()
        ),
        "",
        f"One profiled step ({p['wall_s']:.2f} s with the profiler on): self time by kind of op",
        "",
        "| kind | s | share of the step |",
        "|---|---|---|",
    ]
    for kind in KINDS:
        lines.append(f"| {kind} | {p['by_kind_s'][kind]:.2f} | {p['by_kind_s'][kind] / p['wall_s']:.0%} |")
    rest = p["wall_s"] - accounted
    lines += [
        f"| no op (Python, DeepSpeed, autograd bookkeeping) | {rest:.2f} | {rest / p['wall_s']:.0%} |",
        "",
        f"GEMMs: {p['gemm_flops'] / 1e12:.2f} TFLOP in {gemm_s:.2f} s = {p['gemm_flops'] / gemm_s / 1e9:.0f} GFLOP/s "
        f"({p['gemm_flops'] / gemm_s / 1e9 / rate:.0%} of the roofline's {rate:.0f}); 6 x params x tokens = "
        f"{6 * r['matmul_params'] * r['trained_tokens'] / 1e12:.2f} TFLOP. The same products timed alone, shape by "
        f"shape: {p['gemm_alone_s']:.2f} s; the step without the profiler is {r['median_step_s']:.2f} s",
        "",
        "AdamW step over every parameter, by torch implementation (the run uses "
        f"{r.get('adamw_impl', 'for-loop')}): " + ", ".join(f"{k} {v:.2f} s" for k, v in r["adamw_step_s"].items()),
        "",
        "| op | self s | kind |",
        "|---|---|---|",
        *(f"| `{o['op']}` | {o['self_s']:.3f} | {o['kind']} |" for o in p["top_ops"]),
    ]
    text = "\n".join(lines) + "\n"
    (out_dir / f"{payload['benchmark']}.md").write_text(text)
    return text


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="an HF model directory (default: SmolLM2-135M-Instruct)")
    p.add_argument("--rows", type=int, default=32, help="rows per optimizer step (W3: 4 prompts x 8)")
    p.add_argument("--micro", type=int, default=16, help="rows per micro-batch")
    p.add_argument("--prompt_tokens", type=int, default=36, help="longest prompt (W3's chat template: ~36)")
    p.add_argument("--max_response_tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps after one warm-up")


def measured(args) -> tuple[dict, dict]:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    results = measure(args)
    config = {k: getattr(args, k) for k in ("rows", "micro", "prompt_tokens", "max_response_tokens", "steps")}
    config["model_name"] = Path(args.model).name if args.model else MODEL.name
    return config, results


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
