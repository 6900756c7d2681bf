"""The parts run/driver.py assembles: actor groups on their placement groups, the reward function, the rollout
source, the evaluation set, the resume point, the engines' start-up settings."""

from __future__ import annotations

import getpass
import json
import os
import tempfile
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import ray

from reinforce_pro.data import embedded_reward
from reinforce_pro.data.prompts import PromptConfig, build_prompts, load_records
from reinforce_pro.models.routing import is_moe_dir
from reinforce_pro.procs import KEEP_FREED_MEMORY, LOG_DIR_ENV
from reinforce_pro.rewards.builtin import exact_match_reward
from reinforce_pro.rewards.loader import load_reward_func
from reinforce_pro.rollout.sampler import PromptSource, Sampler
from reinforce_pro.rollout.vllm_engine import ENGINE_DEVICES_ENV, EngineConfig, VLLMEngine, uses_aot_cache
from reinforce_pro.run.config import VLLM_DTYPES, RunConfig, RunPlan
from reinforce_pro.run.errors import UserInputError
from reinforce_pro.trainer.checkpoint import find_latest, load_state, truncate_jsonl
from reinforce_pro.trainer.ppo_trainer import EvalSet
from reinforce_pro.workers.critic import CriticWorker
from reinforce_pro.workers.group import ActorGroup
from reinforce_pro.workers.launcher import (
    SHARES,
    GroupSpec,
    bundle_of,
    create_group,
    env_options,
    make_placement_group,
    node_of,
)
from reinforce_pro.workers.policy import PolicyWorker, ReferenceWorker
from reinforce_pro.workers.reward_model import RewardModelWorker


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
    samples = loop.rollout_batch_size * cfg.rollout.n_samples_per_prompt
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


def engine_slots(cfg: RunConfig) -> int:
    return cfg.engines.count * cfg.engines.config.tensor_parallel_size


def logical_cpus(cfg: RunConfig) -> int:
    where = cfg.placement
    n = engine_slots(cfg) + where.actor.size
    if cfg.needs_reference:
        n += where.ref.size
    if cfg.needs_critic:
        n += where.critic.size
    if cfg.selfplay and cfg.selfplay.judge_pretrain:
        n += 1
    return n + 2


def cpu_threads(cfg: RunConfig, use_gpu: bool) -> tuple[dict | None, dict | None]:
    """(engine env, trainer env) of CPU actors. Under --async_train, where engines and trainer ranks run at
    the same time, each actor's thread count: the cores are split in two halves, the engines' split over the
    engines, the trainer's over the policy ranks (reference and critic ranks run when the policy's do not,
    and take the same count); otherwise every core for each actor (synchronous: phases alternate). The model
    ranks also keep freed memory (procs.py: KEEP_FREED_MEMORY). None: nothing to set (GPU)."""
    if use_gpu:
        return None, None
    if not cfg.loop.async_train:
        return None, dict(KEEP_FREED_MEMORY)
    import os

    cores = os.cpu_count() or 1
    engine_cores = max(1, cores // 2)
    per_engine = max(1, engine_cores // engine_slots(cfg))
    per_rank = max(1, (cores - engine_cores) // cfg.placement.actor.size)
    return {"REINFORCE_PRO_CPU_THREADS": str(per_engine)}, {"REINFORCE_PRO_CPU_THREADS": str(per_rank),
                                                             **KEEP_FREED_MEMORY}  # fmt: skip


def with_log_dir(env: dict | None, plan: RunPlan) -> dict | None:
    """`env` plus where the actors write their output (procs.py: capture_output): the run's logs/
    directory, or nothing with --verbose (plan.log_dir None), which leaves it on the console."""
    if plan.log_dir is None:
        return env
    return {**(env or {}), LOG_DIR_ENV: str(plan.log_dir)}


def role(default=None):
    """A RunActors field that holds actors of one role (placement.json lists it, release() ends it)."""
    return field(default=default, metadata={"role": True})


@dataclass
class RunActors:
    """Every actor and placement group one run holds. What is recorded and released is derived from the
    fields marked as roles: a role added here needs no second list to keep in step."""

    policy: ActorGroup = role()
    engines: list = role()
    owned_engines: bool = True  # False: the caller passed the engines in and keeps them
    pgs: list = field(default_factory=list)
    reference: ActorGroup | None = role()
    critic: ActorGroup | None = role()
    critic_pg: object = None  # the critic's placement group: --colocate_critic_reward puts the reward model there
    reward_model: list | None = role()
    judge: list | None = role()

    def roles(self) -> dict[str, list]:
        """{role: its actors} for every role that has some."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("role") and getattr(self, f.name)}

    def release(self) -> None:
        """Kill the actors this run created and free its placement groups (the cluster may outlive the run)."""
        from ray.util import remove_placement_group

        for name, actors in self.roles().items():
            if name != "engines" or self.owned_engines:
                for actor in actors:
                    ray.kill(actor)
        for pg in self.pgs:
            remove_placement_group(pg)


def build_groups(cfg: RunConfig, plan: RunPlan, use_gpu: bool, engines=None) -> RunActors:
    """Placement groups and actors for every role the config asks for; `engines` reuses existing engines."""
    run = RunActors(owned_engines=engines is None)

    def new_pg(spec: GroupSpec):
        pg = make_placement_group(spec, use_gpu)
        run.pgs.append(pg)
        return pg

    where = cfg.placement
    actor_pg = new_pg(where.actor)
    engine_env, trainer_env = (with_log_dir(env, plan) for env in cpu_threads(cfg, use_gpu))
    colocate_all = where.colocate_all_models
    colocate_ref = where.colocate_actor_ref or colocate_all
    share = (
        SHARES.all_policy if colocate_all else (SHARES.pair if colocate_ref and cfg.needs_reference else SHARES.alone)
    )
    # the kernel installed (start_config resolved it for a run; a caller building groups directly gets it here)
    fwd = replace(cfg.forward, attn_implementation=attn_implementation(cfg.forward.attn_implementation))
    unsplit = replace(fwd, ring_size=1)  # the reference and critic run unsplit
    run.policy = create_group(
        PolicyWorker,
        where.actor,
        actor_pg,
        use_gpu,
        share,
        lambda d: (plan.pretrain, cfg.actor_optim, cfg.loss, d, cfg.seed, fwd, cfg.models.lora),
        trainer_env,
        ring=cfg.forward.ring_size,
    )
    if cfg.needs_reference:
        ref_spec = where.actor if colocate_ref else where.ref
        ref_pg = actor_pg if colocate_ref else new_pg(ref_spec)
        ref_args = (
            plan.pretrain, cfg.rollout.temperature, cfg.actor_optim.param_dtype, unsplit, cfg.loss.sampling_filter
        )  # fmt: skip
        ref_share = SHARES.all_reference if colocate_all else share
        run.reference = create_group(
            ReferenceWorker, ref_spec, ref_pg, use_gpu, ref_share, lambda d: ref_args, trainer_env
        )
    if cfg.needs_critic:
        models = cfg.models
        pretrain = models.critic_pretrain or plan.pretrain
        run.critic_pg = new_pg(where.critic)
        critic_share = SHARES.pair if where.colocate_critic_reward else SHARES.alone  # other half: the reward model
        run.critic = create_group(
            CriticWorker, where.critic, run.critic_pg, use_gpu, critic_share,
            lambda d: (pretrain, cfg.critic_optim, d, cfg.seed, models.value_clip, models.value_head_prefix, unsplit),
            trainer_env,
        )  # fmt: skip
    engine_cfg = replace(cfg.engines.config, model_path=plan.pretrain)
    devices = policy_devices(run.policy) if use_gpu and colocate_all else None
    engine_cls = ray.remote(VLLMEngine)
    run.engines = engines or [
        engine_cls.options(**engine_options(cfg, use_gpu, actor_pg, i, engine_env, devices)).remote(engine_cfg, i)
        for i in range(cfg.engines.count)
    ]
    return run


def policy_devices(policy) -> list[str | None]:
    """The device (CUDA_VISIBLE_DEVICES) Ray gave each policy rank, rank order."""
    return ray.get([p.__ray_call__.remote(lambda self: os.environ.get("CUDA_VISIBLE_DEVICES")) for p in policy])


def engine_options(
    cfg: RunConfig, use_gpu: bool, actor_pg, index: int, env: dict | None = None, devices: list | None = None
) -> dict:
    """A whole GPU per tensor-parallel rank, or with --colocate_all_models (OpenRLHF's hybrid engine) a share
    of the bundles of the policy ranks index * tp ... index * tp + tp - 1, i.e. of their GPUs: the actor sits
    in the first, and with tp > 1 on GPUs it is told every device of them (`devices`: policy_devices) so
    that vLLM's TP workers run one on each (ENGINE_DEVICES_ENV). `env`: environment variables of the engine's
    process (cpu_threads)."""
    tp = cfg.engines.config.tensor_parallel_size
    if not cfg.placement.colocate_all_models:
        return {"num_cpus": 1, "num_gpus": tp if use_gpu else 0, **env_options(env)}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    actor = cfg.placement.actor
    first = index * tp % actor.size
    if devices is not None and tp > 1:
        env = {**(env or {}), ENGINE_DEVICES_ENV: ",".join(str(d) for d in devices[first : first + tp])}
    bundle = bundle_of(actor_pg, actor, first)
    strategy = PlacementGroupSchedulingStrategy(placement_group=actor_pg, placement_group_bundle_index=bundle)
    share = SHARES.all_engine
    options = {"num_cpus": share, "num_gpus": share if use_gpu else 0, "scheduling_strategy": strategy}
    return {**options, **env_options(env)}


def record_placement(run: RunActors, run_dir: Path) -> dict:
    """Where every actor of the run landed ({role: [{"node_id", "ip"} per rank / engine]}), written to
    placement.json in the run directory and summarised in one line."""
    placement = {role: [node_of(a) for a in actors] for role, actors in run.roles().items()}
    (run_dir / "placement.json").write_text(json.dumps(placement, indent=1))
    summary = ", ".join(
        f"{role} {len(where)} on {len({w['node_id'] for w in where})} node(s)" for role, where in placement.items()
    )
    print(f"[placement] {summary} ({run_dir / 'placement.json'})", flush=True)
    return placement


def reward_function(cfg: RunConfig, plan: RunPlan, use_gpu: bool, groups: RunActors):
    if plan.reward_source == "builtin:exact_match":
        return exact_match_reward
    if plan.reward_source.startswith("builtin:"):  # an embedded task's verifier
        return embedded_reward(plan.reward_source.split(":", 1)[1])
    if plan.reward_source.startswith("model:"):
        extra = env_options(with_log_dir(None, plan))
        share = SHARES.alone
        if cfg.placement.colocate_critic_reward:  # in the critic's first slot, beside critic rank 0
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            share = SHARES.pair
            extra["scheduling_strategy"] = PlacementGroupSchedulingStrategy(groups.critic_pg, 0)
        rm = ray.remote(RewardModelWorker).options(num_cpus=share, num_gpus=share if use_gpu else 0, **extra)
        actor = rm.remote(cfg.models.reward_pretrain, cfg.forward.micro_batch_size)
        groups.reward_model = [actor]
        return lambda queries, prompts, labels: ray.get(actor.score.remote(queries))
    return load_reward_func(plan.reward_source)


def selfplay_source(cfg: RunConfig, plan: RunPlan, groups: RunActors, sampler: Sampler, use_gpu: bool):
    """The Absolute-Zero rollout source, with its task, weights and (optionally) a judge engine."""
    from reinforce_pro.selfplay.selfplay_source import SelfPlaySource

    selfplay = cfg.selfplay
    flag_weights = selfplay.config.weights  # the flags set the safety / completion weights of any task
    weights = {d: flag_weights.get(d, w) for d, w in plan.task.weights.items()}
    judge = None
    if selfplay.judge_pretrain:
        judge_cfg = EngineConfig(
            model_path=selfplay.judge_pretrain, dtype=cfg.engines.config.dtype, seed=cfg.seed,
            gpu_memory_utilization=cfg.engines.config.gpu_memory_utilization, max_model_len=cfg.data.max_len,
            cpu_kv_cache_gib=cfg.engines.config.cpu_kv_cache_gib,
        )  # fmt: skip
        options = {"num_cpus": 1, "num_gpus": 1 if use_gpu else 0, **env_options(with_log_dir(None, plan))}
        judge = [ray.remote(VLLMEngine).options(**options).remote(judge_cfg, 0, "judge")]
        groups.judge = judge
    config = replace(selfplay.config, weights=weights)
    sdk_agent = None
    if plan.agent_cls is not None:  # --agent_func_path: an OpenAI-SDK solver (prepare refuses AgentInstance files)
        from reinforce_pro.agents.openai_agents import OpenAIAgentSource

        sdk_agent = OpenAIAgentSource(sampler, plan.agent_cls, cfg.agent.config, solver_only=True)
    return SelfPlaySource(sampler, plan.task, config, seed=cfg.seed, judge_engines=judge, max_len=cfg.data.max_len,
                          sdk_agent=sdk_agent)  # fmt: skip


def eval_set(cfg: RunConfig, plan: RunPlan, tokenizer, source=None) -> EvalSet | None:
    """--eval_dataset read like --prompt_data (same keys and template); self-play evaluates its task's
    held-out ladder instead, when --eval_steps or --eval_before_training asks for evaluations. With
    --agent_func_path, `source` (the run's agent source) plays the held-out episodes."""
    ev, data = cfg.evaluation, cfg.data
    if plan.task is not None and (cfg.loop.eval_steps > 0 or cfg.loop.eval_before_training):
        from reinforce_pro.selfplay.ladder import LadderEval

        levels = plan.task.ladder()
        return LadderEval(plan.task, levels, data.max_len, getattr(source, "sdk_agent", None)) if levels else None
    if ev is None:
        return None
    records = load_records(ev.dataset, ev.split)
    label_key = data.label_key or ("label" if data.prompt_data is None else None)  # built-in data has labels
    spec = PromptConfig(data.input_key, label_key, data.input_template, data.apply_chat_template)
    prompts = build_prompts(records, spec, tokenizer, ev.dataset)
    agent = source if plan.agent_cls is not None else None
    if agent is not None and any(isinstance(p["prompt"], list) for p in prompts):
        raise ValueError(
            f"--eval_dataset {ev.dataset}: dialogue records (a list of turns) cannot be evaluated with "
            "--agent_func_path (a dialogue trains a row per target turn and has no one score)"
        )
    return EvalSet(Path(ev.dataset).stem, prompts, ev.n_samples_per_prompt, ev.temperature, agent)


def resume_checkpoint(cfg: RunConfig, plan: RunPlan) -> Path | None:
    """With --load_checkpoint: the latest complete checkpoint (None: start from scratch). The run's jsonl
    files are cut back to its step, so the resumed run appends to them without duplicates."""
    checkpoints = cfg.loop.checkpoints
    if checkpoints is None or not checkpoints.resume:
        return None
    ckpt = find_latest(checkpoints.ckpt_path)
    if ckpt is None:
        print(f"[resume] no complete checkpoint in {checkpoints.ckpt_path}: starting from scratch", flush=True)
        return None
    step = load_state(ckpt)["step"]
    for path in plan.run_dir.glob("*.jsonl"):  # every per-step file the run writes (MetricsLogger.write)
        truncate_jsonl(path, step)
    return ckpt


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
    made_by_run = Path(plan.pretrain).resolve().is_relative_to(Path(plan.run_dir).resolve())
    # an MoE engine records every token's experts: routing/* and --routing_replay r3 (rollout/route_capture.py)
    return replace(
        engine, model_path=plan.pretrain, aot_compile=not made_by_run, capture_routes=is_moe_dir(plan.pretrain)
    )


def rollout_source(cfg: RunConfig, plan: RunPlan, groups: RunActors, sampler: Sampler, use_gpu: bool):
    """Where a step's samples come from: self-play, the user's agent, or the prompts."""
    if plan.task is not None:
        return selfplay_source(cfg, plan, groups, sampler, use_gpu)
    if plan.agent_cls is not None:
        from reinforce_pro.agents.agent_source import AgentSource
        from reinforce_pro.agents.openai_agents import OpenAIAgent, OpenAIAgentSource

        if isinstance(plan.agent_cls, OpenAIAgent):
            return OpenAIAgentSource(sampler, plan.agent_cls, cfg.agent.config)
        return AgentSource(sampler, plan.agent_cls, cfg.agent.config)
    return PromptSource(sampler)


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
