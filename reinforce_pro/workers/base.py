"""What every model-holding Ray actor shares: torch.distributed set-up, DeepSpeed initialisation, and
micro-batched forward passes. Its settings are workers/configs.py's; the process set-up every actor does first
(threads, allocator, output) is reinforce_pro/procs.py's.

One actor is one data-parallel rank. On a GPU node it owns one GPU and uses NCCL; without a GPU
DeepSpeed runs on its CPU accelerator and falls back to gloo, with every listener on loopback.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from reinforce_pro.algos.stats import Stat, merge_stats
from reinforce_pro.experience import budget_chunks, consecutive_slices, pad_actions, padding_columns
from reinforce_pro.models.logprobs import response_log_probs
from reinforce_pro.models.routing import RoutingPass
from reinforce_pro.models.sampling_filter import SamplingFilter
from reinforce_pro.procs import use_host_threads
from reinforce_pro.workers.configs import DistInfo, OptimConfig


def setup_distributed(dist: DistInfo) -> None:
    """Set the env torch.distributed reads and start the process group (gloo on CPU, NCCL on GPU)."""
    os.environ.update(
        RANK=str(dist.rank),
        WORLD_SIZE=str(dist.world_size),
        LOCAL_RANK="0",
        MASTER_ADDR=dist.master_addr,
        MASTER_PORT=str(dist.master_port),
    )
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/reinforce_pro/torch_extensions"))
        load_shm_op(Path(os.environ["TORCH_EXTENSIONS_DIR"]))
    use_host_threads()
    import deepspeed

    deepspeed.init_distributed(
        dist_backend="nccl" if torch.cuda.is_available() else "gloo",
        init_method=dist.init_method,
        rank=dist.rank,
        world_size=dist.world_size,
    )


SHM_OP = "deepspeed_shm_comm"  # DeepSpeed's shared-memory comm op, JIT-built by every CPU rank's init_distributed


def load_shm_op(extensions_dir: Path, load=None) -> None:
    """Load DeepSpeed's CPU comm op before init_distributed does, so that a lock a dead process left cannot
    hang the run.

    torch's JIT extension loader guards the op's build directory with a plain file (<dir>/<op>/lock) that
    every loading process creates and removes, even when the op is already built; a process killed while it
    holds the file (Ctrl-C during start-up, a killed actor, a stopped machine) leaves it behind, and from then
    on every rank of every run waits for it in FileBaton.wait, forever and silently. Here each process takes
    a kernel lock (flock on <dir>/reinforce_pro.lock, released when its holder dies, however it dies) around
    the load: a build lock found while holding it belongs to no live loader and is removed. DeepSpeed keeps
    the loaded op, so init_distributed does not load it again. `load`: the loader (tests)."""
    import fcntl

    if load is None:
        from deepspeed.comm.torch import build_shm_op as load
    extensions_dir.mkdir(parents=True, exist_ok=True)
    with open(extensions_dir / "reinforce_pro.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        stale = extensions_dir / SHM_OP / "lock"
        if stale.exists():
            print(f"[deepspeed] removing {stale}, left by a process that died while loading the op", flush=True)
            stale.unlink(missing_ok=True)
        load()


def device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def deepspeed_config(opt: OptimConfig, world_size: int) -> dict:
    zero = {"stage": opt.zero_stage, "overlap_comm": opt.overlap_comm}
    if opt.adam_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    return {
        "train_micro_batch_size_per_gpu": opt.micro_batch_size,
        "gradient_accumulation_steps": opt.grad_accum_steps,
        "train_batch_size": opt.micro_batch_size * opt.grad_accum_steps * world_size,
        "gradient_clipping": opt.max_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": opt.param_dtype == "bf16"},
        "fp16": {"enabled": opt.param_dtype == "fp16"},
        # A plain torch AdamW avoids JIT-building DeepSpeed's fused / CPU Adam ops (a C++ compile of each at start-up).
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def initialize_deepspeed(model: torch.nn.Module, opt: OptimConfig, world_size: int):
    """Wrap `model` with an AdamW optimizer and the LR schedule in a DeepSpeed engine."""
    import deepspeed
    from transformers import get_scheduler

    if opt.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": opt.gradient_checkpointing_use_reentrant}
        )
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=opt.learning_rate,
        betas=tuple(opt.adam_betas),
        eps=opt.adam_eps,
        weight_decay=opt.l2,
        # one vectorised pass per tensor (CPU and CUDA kernels): torch's CPU default loops over the parameters
        # with ~10 ops each, an order of magnitude slower on a real model (benchmarks/bench_train_phase.py)
        fused=True,
    )
    extra = {"min_lr": opt.learning_rate * opt.min_lr_ratio} if opt.lr_scheduler == "cosine_with_min_lr" else None
    scheduler = get_scheduler(
        opt.lr_scheduler,
        optimizer,
        num_warmup_steps=math.ceil(opt.total_steps * opt.lr_warmup_ratio),
        num_training_steps=opt.total_steps,
        scheduler_specific_kwargs=extra,
    )
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(opt, world_size)
    )
    return engine


def row_chunks(
    attention_mask: torch.Tensor, micro: int, max_tokens: int | None = None, packed: bool = False
) -> list[slice]:
    """Consecutive row ranges for a forward pass: `micro` rows each, or under a token budget (budget_chunks:
    padded tokens, or real ones when the forward is `packed`)."""
    rows = attention_mask.size(0)
    if max_tokens is None:
        return [slice(i, i + micro) for i in range(0, rows, micro)]
    return consecutive_slices(budget_chunks(attention_mask.sum(-1).tolist(), max_tokens, packed))


@torch.no_grad()
def batched_log_probs(
    model,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    num_actions: int,
    temperature: float,
    micro: int,
    max_tokens: int | None = None,
    packed: bool = False,
    log_probs_fn=None,
    sampling_filter: SamplingFilter | None = None,
    outside: list[torch.Tensor] | None = None,
    routing: RoutingPass | None = None,
) -> torch.Tensor:
    """(B, T) float32 log-probs of the response tokens, computed `micro` rows (or `max_tokens` tokens) at a
    time; `packed`: padding-free forwards (--packing_samples); `log_probs_fn`: instead of
    models.logprobs.response_log_probs, with its arguments (the policy's ring under --ring_attn_size);
    `sampling_filter`: the engine's filters, replayed (models/sampling_filter.py); `outside`: receives the
    (B, T) float 0/1 of sampled tokens that filter would have removed, when it is active; `routing`: an MoE
    model's routes for each forward, gathering what its routers did (models/routing.py; padded or packed)."""
    log_probs_fn = log_probs_fn or response_log_probs
    dev = device()
    out, flags = [], []
    for rows in row_chunks(attention_mask, micro, max_tokens, packed):
        columns, keep = padding_columns(attention_mask[rows], num_actions)  # padding of every row: skipped
        seq, mask = sequences[rows, columns].to(dev), attention_mask[rows, columns].to(dev)
        extra = {"outside": flags} if outside is not None else {}
        if routing is not None:
            routing.before(rows, columns, mask, routing.replay.layout(model, mask) if packed else None)
        lp, _ = log_probs_fn(model, seq, mask, keep, temperature, packed=packed, sampling_filter=sampling_filter,
                             **extra)  # fmt: skip
        if routing is not None:
            routing.after(keep, num_actions, sequences.size(1))
        out.append(pad_actions(lp.float().cpu(), num_actions))
        if flags:
            flags[-1] = pad_actions(flags[-1].float().cpu(), num_actions)
    if outside is not None and len(flags) == len(out):
        outside.append(torch.cat(flags, dim=0))
    return torch.cat(out, dim=0)


def optimizer_step_stats(engine, history: list[dict[str, Stat]], group: str) -> dict[str, Stat]:
    """The micro-batch metrics of one optimizer step merged, each by its own reduction (algos/stats.py),
    plus `<group>/grad_norm` and `<group>/lr`: one value per optimizer step, the same on every rank."""
    stats = merge_stats(history)
    grad_norm = engine.get_global_grad_norm()
    if grad_norm is not None:
        stats[f"{group}/grad_norm"] = Stat(float(grad_norm))
    stats[f"{group}/lr"] = Stat(float(engine.get_lr()[0]))
    return stats


DS_TAG = "state"  # one DeepSpeed tag per checkpoint directory: the directory itself names the step


def save_engine_state(engine, path: str) -> None:
    """Weights, optimizer and LR-scheduler states of a DeepSpeed engine under `path` (every rank calls it;
    each writes its own shard files)."""
    engine.save_checkpoint(path, tag=DS_TAG, save_latest=False)


def load_engine_state(engine, path: str) -> None:
    load_path, _ = engine.load_checkpoint(
        path, tag=DS_TAG, load_optimizer_states=True, load_lr_scheduler_states=True, load_module_strict=True
    )
    if load_path is None:
        raise FileNotFoundError(f"{path}: no DeepSpeed state (was the checkpoint saved with --disable_ds_ckpt?)")
