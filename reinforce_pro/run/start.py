"""The settings a run can only fix once it starts (start_config): the attention kernel installed, the
optimizer steps the prompts make, the weight-sync backend, the engines' start-up settings and what the console
says about them."""

from __future__ import annotations

import getpass
import os
import tempfile
from dataclasses import replace
from pathlib import Path

from reinforce_pro.models.routing import is_moe_dir
from reinforce_pro.rollout.vllm_engine import EngineConfig, uses_aot_cache
from reinforce_pro.run.config import VLLM_DTYPES, RunConfig, RunPlan
from reinforce_pro.run.errors import UserInputError


def attn_implementation(name: str) -> str:
    """--attn_implementation; flash_attention_2 (OpenRLHF's default) needs flash-attn, which CPU machines
    never have: fall back to PyTorch's sdpa and say so."""
    import importlib.util

    if name == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        print("[notice] flash-attn is not installed: trainer models use attn_implementation=sdpa", flush=True)
        return "sdpa"
    return name


def optimizer_steps(cfg: RunConfig, num_prompts: int) -> int:
    """Optimizer steps over the whole run (the LR schedule's length)."""
    loop = cfg.loop
    steps = num_prompts // loop.rollout_batch_size * loop.num_episodes
    samples = loop.rollout_batch_size * loop.n_samples_per_prompt
    return max(1, steps * (samples // loop.train_batch_size * loop.max_epochs))


def sync_backend(cfg: RunConfig, use_gpu: bool) -> str:
    """The weight-sync backend this run uses. --vllm_sync_backend nccl is OpenRLHF's default and so in every
    script; where NCCL cannot run it is replaced, with a one-line notice: without GPUs by gloo (the same
    broadcast; 1.2x / 1.9x faster than the object store for the toy / a 100M model here: docs/benchmarks.md),
    and by the object store when the engines share the policy's GPUs (--colocate_all_models: NCCL refuses
    two ranks on one GPU) or --rollout_staleness needs older weights kept (only the object store keeps them).
    An explicit gloo with --rollout_staleness is an error (train_ppo_ray.py)."""
    asked = cfg.engines.sync_backend
    if asked == "object_store":
        return "object_store"
    if cfg.loop.rollout_staleness > 0:
        chosen, why = "object_store", "--rollout_staleness needs older weights kept"
    elif asked == "gloo":
        return "gloo"
    elif not use_gpu:
        chosen, why = "gloo", "no GPUs"
    elif cfg.placement.colocate_all_models:
        chosen, why = "object_store", "--colocate_all_models puts engines on the policy's GPUs"
    else:
        return "nccl"
    print(f"[weight sync] {asked}: {why}; syncing with {chosen} (--vllm_sync_backend)", flush=True)
    return chosen


# OpenRLHF frees GPU memory between phases with these; a CPU run has nothing to free (engines and trainer hold
# host memory, which sleeping would only hand back to the same process).
SLEEP_FLAGS = {"vllm_enable_sleep": "vLLM sleep mode", "deepspeed_enable_sleep": "DeepSpeed state offload"}


def check_sleep_flags(cfg: RunConfig, use_gpu: bool) -> None:
    """On CPU: accepted, a one-line notice each, training unchanged. On GPU: not implemented, one line."""
    for flag in cfg.engines.sleep_flags:
        if use_gpu:
            raise UserInputError(f"--{flag} ({SLEEP_FLAGS[flag]}) is not implemented on GPU yet: drop it")
        print(f"[notice] --{flag}: a CPU run has no device memory to free; accepted, training unchanged", flush=True)


def start_config(cfg: RunConfig, plan: RunPlan, use_gpu: bool) -> RunConfig:
    """`cfg` with what is known once the run starts: the policy's starting weights, the optimizers' step
    count (from the number of prompts), the weight-sync backend this machine allows, the attention kernel
    installed, the run directory."""
    total_steps = optimizer_steps(cfg, len(plan.prompts))
    engines = cfg.engines
    loop = replace(
        cfg.loop,
        sync_backend=sync_backend(cfg, use_gpu),
        sync_dtype=engines.config.dtype,
        engine_quantization=engines.config.quantization,
        trainer_dtype=cfg.actor_optim.param_dtype,
        sync_bucket_mb=engines.sync_bucket_mb,
        engine_tp_size=engines.config.tensor_parallel_size,
        best_model_dir=plan.run_dir / "best_model",
    )
    cfg = replace(
        cfg,
        engines=replace(cfg.engines, config=engine_config(cfg.engines.config, plan)),
        actor_optim=replace(cfg.actor_optim, total_steps=total_steps),
        critic_optim=replace(cfg.critic_optim, total_steps=total_steps),
        loop=loop,
        forward=replace(cfg.forward, attn_implementation=attn_implementation(cfg.forward.attn_implementation)),
    )
    if cfg.output.wandb is not None:
        wandb = replace(cfg.output.wandb, config=cfg.as_dict())
        cfg = replace(cfg, output=replace(cfg.output, wandb=wandb))
    return cfg


def engine_config(engine: EngineConfig, plan: RunPlan) -> EngineConfig:
    """The engines load the policy's starting weights. A model directory the user named outlives the run, so a
    later run from it loads vLLM's ahead-of-time compiled model (keyed by the path, so its warm-up skips the
    trace); one the run made itself (the built-in model, a warm start, under the run directory) is new every
    run and keeps Inductor's graph cache, which any directory of an architecture compiled before hits."""
    made_by_run = Path(plan.model_path).resolve().is_relative_to(Path(plan.run_dir).resolve())
    # an MoE engine records every token's experts: routing/* and --routing_replay r3 (rollout/route_capture.py)
    return replace(
        engine, model_path=plan.model_path, aot_compile=not made_by_run, capture_routes=is_moe_dir(plan.model_path)
    )


def announce_engines(cfg: RunConfig, use_gpu: bool) -> None:
    """What the engines' start does before the first step, the longest wait of a cold start."""
    count, device = cfg.engines.count, "GPU" if use_gpu else "CPU"
    if cfg.engines.config.enforce_eager:
        what = "no compilation (--enforce_eager)"
    elif cfg.engines.config.capture_routes:
        what = "no compilation: a mixture-of-experts engine runs eagerly, recording each token's experts (routing/*)"
    elif use_gpu:
        what = "compiling the model's graph with torch.compile (vLLM caches it per model path)"
    elif uses_aot_cache(cfg.engines.config):
        cache = os.path.join(
            os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm"), "torch_compile_cache"
        )
        what = (
            f"compiling the model with torch.compile ahead of time, cached by vLLM in {cache} for this model "
            "directory (a later run from it loads it without tracing; --enforce_eager skips compiling, decoding "
            "more slowly)"
        )
    else:  # vLLM's CPU build compiles with torch.compile's Inductor, whose cache is keyed by the graph
        default = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")  # Inductor's own default
        cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default
        what = (
            f"compiling the model's graph with torch.compile, cached by Inductor in {cache} (a later run of the "
            "same architecture and lengths loads it; --enforce_eager skips compiling, decoding more slowly)"
        )
    print(f"[engines] starting {count} vLLM engine{'s' * (count > 1)} ({device}): {what}", flush=True)


def engines_load_policy_weights(cfg: RunConfig) -> bool:
    """Engines that load the policy's starting checkpoint hold what a weight sync would send them: the policy
    keeps it in fp32 or in the engines' own dtype (a sync casts to the engines' dtype, as their load does),
    and no quantizer of ours stands between the two."""
    optim, engine = cfg.actor_optim, cfg.engines.config
    same_dtype = optim.param_dtype == "fp32" or VLLM_DTYPES[optim.param_dtype] == engine.dtype
    return same_dtype and engine.quantization is None
