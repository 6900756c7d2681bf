"""The run's actors: the policy, reference, critic and reward-model groups and the vLLM engines on their
placement groups (RunActors, build_groups), each actor's share of the CPU cores and its log file, and where each
landed (placement.json)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import ray

from reinforce_pro.procs import KEEP_FREED_MEMORY, LOG_DIR_ENV
from reinforce_pro.rollout.vllm_engine import ENGINE_DEVICES_ENV, EngineConfig, VLLMEngine
from reinforce_pro.run.config import RunConfig, RunPlan
from reinforce_pro.run.start import attn_implementation
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


def engine_slots(cfg: RunConfig) -> int:
    return cfg.engines.count * cfg.engines.config.tensor_parallel_size


def logical_cpus(cfg: RunConfig) -> int:
    where = cfg.placement
    n = engine_slots(cfg) + where.actor.size
    if cfg.needs_reference:
        n += where.ref.size
    if cfg.needs_critic:
        n += where.critic.size
    if cfg.distill:  # the teacher's engines, or its ranks placed as the reference's are
        n += cfg.distill.teacher_num_engines if cfg.distill.teacher_backend == "engine" else where.ref.size
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
    teacher: ActorGroup | None = role()  # on-policy distillation's frozen teacher (algos/distill.py)
    critic: ActorGroup | None = role()
    critic_pg: object = None  # the critic's placement group: --colocate_critic_reward puts the reward model there
    reward_model: list | None = role()
    judge: list | None = role()
    new_engine: Callable[[int], object] | None = None  # engine i started again in its place; None: caller's engines

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
    """Placement groups and actors for every role the config asks for; `engines` reuses existing engines. When
    one cannot be created (a placement the cluster cannot satisfy after a node was lost), those created before it
    are released: nothing of the run stays on the cluster."""
    run = RunActors(owned_engines=engines is None)
    try:
        _create_all(run, cfg, plan, use_gpu, engines)
    except BaseException:
        run.release()
        raise
    return run


def _create_all(run: RunActors, cfg: RunConfig, plan: RunPlan, use_gpu: bool, engines) -> None:
    """build_groups' work: each role's placement group and actors into `run`, in order."""

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
        lambda d: (plan.model_path, cfg.actor_optim, cfg.loss, d, cfg.seed, fwd, cfg.models.lora),
        trainer_env,
        ring=cfg.forward.ring_size,
    )
    if cfg.needs_reference:
        ref_spec = where.actor if colocate_ref else where.ref
        ref_pg = actor_pg if colocate_ref else new_pg(ref_spec)
        ref_args = (
            plan.model_path, cfg.rollout.temperature, cfg.actor_optim.param_dtype, unsplit, cfg.loss.sampling_filter
        )  # fmt: skip
        ref_share = SHARES.all_reference if colocate_all else share
        run.reference = create_group(
            ReferenceWorker, ref_spec, ref_pg, use_gpu, ref_share, lambda d: ref_args, trainer_env
        )
    run.teacher = teacher_group(cfg, plan, use_gpu, new_pg, unsplit, trainer_env) if cfg.distill else None
    if cfg.needs_critic:
        models = cfg.models
        start = models.critic_pretrain or plan.model_path  # the critic's backbone: the policy's unless given
        run.critic_pg = new_pg(where.critic)
        critic_share = SHARES.pair if where.colocate_critic_reward else SHARES.alone  # other half: the reward model
        run.critic = create_group(
            CriticWorker, where.critic, run.critic_pg, use_gpu, critic_share,
            lambda d: (start, cfg.critic_optim, d, cfg.seed, models.value_clip, models.value_head_prefix, unsplit),
            trainer_env,
        )  # fmt: skip
    engine_cfg = replace(cfg.engines.config, model_path=plan.model_path)
    devices = policy_devices(run.policy) if use_gpu and colocate_all else None
    engine_cls = ray.remote(VLLMEngine)
    if engines is None:
        run.new_engine = lambda i: engine_cls.options(
            **engine_options(cfg, use_gpu, actor_pg, i, engine_env, devices)
        ).remote(engine_cfg, i)  # fmt: skip
    run.engines = engines or [run.new_engine(i) for i in range(cfg.engines.count)]


def teacher_group(cfg: RunConfig, plan: RunPlan, use_gpu: bool, new_pg, forward, env) -> list:
    """On-policy distillation's teacher: prefill-only engines (--teacher_backend engine), or a frozen scorer like
    the reference, on bundles of its own shaped like the reference's; never synced."""
    if cfg.distill.teacher_backend == "engine":
        return teacher_engines(cfg, plan, use_gpu)
    where = cfg.placement.ref
    args = (plan.teacher_path, cfg.distill.opd_kd_temperature, cfg.actor_optim.param_dtype, forward, None, "teacher")
    return create_group(ReferenceWorker, where, new_pg(where), use_gpu, SHARES.alone, lambda d: args, env)


def teacher_engines(cfg: RunConfig, plan: RunPlan, use_gpu: bool) -> list:
    """--teacher_backend engine: the teacher's vLLM engines, in the dtype the actor teacher would use (the run's
    --param_dtype, and its --fp32_lm_head), a whole GPU each; rollout/teacher_engines.py asks them for prompt
    log-probs."""
    from reinforce_pro.run.config import VLLM_DTYPES

    engine_cfg = EngineConfig(
        model_path=plan.teacher_path, dtype=VLLM_DTYPES[cfg.actor_optim.param_dtype], seed=cfg.seed,
        gpu_memory_utilization=cfg.engines.config.gpu_memory_utilization, max_model_len=cfg.data.max_len,
        cpu_kv_cache_gib=cfg.engines.config.cpu_kv_cache_gib, fp32_head=cfg.forward.fp32_lm_head,
    )  # fmt: skip
    options = {"num_cpus": 1, "num_gpus": 1 if use_gpu else 0, **env_options(with_log_dir(None, plan))}
    engine = ray.remote(VLLMEngine).options(**options)
    return [engine.remote(engine_cfg, i, "teacher") for i in range(cfg.distill.teacher_num_engines)]


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
