"""Flags -> actor groups -> rollout source + experience builder -> trainer. The one place that reads the whole
namespace."""

from __future__ import annotations

import json
from pathlib import Path

import ray

from reinforce_pro.algos.kl import build_kl_controller
from reinforce_pro.algos.losses import LossSettings
from reinforce_pro.data.prompts import PromptSpec, build_prompts, load_records
from reinforce_pro.models.lora import LoraSettings, trainable_summary
from reinforce_pro.rewards.builtin import exact_match_reward
from reinforce_pro.rewards.loader import load_reward_func
from reinforce_pro.rollout.sampler import PromptSource, RolloutConfig, Sampler
from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine
from reinforce_pro.trainer.checkpoint import find_latest, load_state, truncate_jsonl
from reinforce_pro.trainer.experience_builder import ExperienceBuilder
from reinforce_pro.trainer.logger import MetricsLogger, WandbConfig
from reinforce_pro.trainer.ppo_trainer import CheckpointConfig, EvalSet, LoopConfig, PPOTrainer
from reinforce_pro.workers.base import LOG_DIR_ENV, OptimConfig
from reinforce_pro.workers.critic import CriticWorker
from reinforce_pro.workers.launcher import (
    GroupSpec,
    create_group,
    env_options,
    gpus_available,
    make_placement_group,
    node_of,
    start_ray,
)
from reinforce_pro.workers.policy import PolicyLossConfig, PolicyWorker, ReferenceWorker
from reinforce_pro.workers.reward_model import RewardModelWorker

VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def attn_implementation(args) -> str:
    """--attn_implementation; flash_attention_2 (OpenRLHF's default) needs flash-attn, which CPU machines
    never have: fall back to PyTorch's sdpa and say so."""
    import importlib.util

    if args.attn_implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        print("[notice] flash-attn is not installed: trainer models use attn_implementation=sdpa", flush=True)
        return "sdpa"
    return args.attn_implementation


def engine_dtype(args) -> str:
    """--vllm_dtype, where auto means the trainer's --param_dtype."""
    return VLLM_DTYPES[args.param_dtype] if args.vllm_dtype == "auto" else args.vllm_dtype


def optimizer_steps(args, num_prompts: int) -> int:
    steps = num_prompts // args.rollout_batch_size * args.num_episodes
    per_step = args.rollout_batch_size * args.n_samples_per_prompt // args.train_batch_size * args.max_epochs
    return max(1, steps * per_step)


def optim_config(args, role: str, world: int, total_steps: int) -> OptimConfig:
    """The optimizer of the policy (role "actor") or the critic. The critic's dotted-only settings
    (--critic.adam.betas, ...) left unset follow the policy's, as v0.9.10's shared flags did."""

    def setting(policy_value, critic_dest: str):
        critic_value = getattr(args, critic_dest)
        return critic_value if role == "critic" and critic_value is not None else policy_value

    return OptimConfig(
        learning_rate=args.critic_learning_rate if role == "critic" else args.actor_learning_rate,
        adam_betas=tuple(setting(args.adam_betas, "critic_adam_betas")),
        adam_eps=setting(args.adam_eps, "critic_adam_eps"),
        l2=setting(args.l2, "critic_l2"),
        lr_scheduler=setting(args.lr_scheduler, "critic_lr_scheduler"),
        lr_warmup_ratio=setting(args.lr_warmup_ratio, "critic_lr_warmup_ratio"),
        min_lr_ratio=setting(args.min_lr_ratio, "critic_min_lr_ratio"),
        total_steps=total_steps,
        max_norm=setting(args.max_norm, "critic_max_norm"),
        zero_stage=args.zero_stage,
        param_dtype=args.param_dtype,
        adam_offload=args.adam_offload,
        overlap_comm=args.overlap_comm,
        gradient_checkpointing=args.gradient_checkpointing,
        gradient_checkpointing_use_reentrant=args.gradient_checkpointing_use_reentrant,
        micro_batch_size=args.micro_train_batch_size,
        grad_accum_steps=args.train_batch_size // (args.micro_train_batch_size * world),
    )


def policy_loss_config(args) -> PolicyLossConfig:
    surrogate = LossSettings(
        clip_eps_low=args.eps_clip_low_high[0],
        clip_eps_high=args.eps_clip_low_high[1],
        dual_clip=args.dual_clip,
        policy_loss_type=args.policy_loss_type,
        enable_vllm_is_correction=args.enable_vllm_is_correction,
        vllm_is_truncated_threshold=tuple(args.vllm_is_truncated_threshold),
        vllm_is_correction_type=args.vllm_is_correction_type,
    )
    return PolicyLossConfig(
        surrogate=surrogate,
        use_kl_loss=args.use_kl_loss,
        kl_estimator=args.kl_estimator,
        kl_coef=args.init_kl_coef,
        entropy_loss_coef=args.entropy_loss_coef,
        temperature=args.temperature,
    )


def rollout_config(args) -> RolloutConfig:
    return RolloutConfig(
        n_samples_per_prompt=args.n_samples_per_prompt,
        prompt_max_len=args.prompt_max_len,
        max_new_tokens=min(args.max_new_tokens, args.max_len - 1),
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        advantage_estimator=args.advantage_estimator,
        gamma=args.gamma,
        lambd=args.lambd,
        std_norm=not args.no_advantage_std_norm,
        reward_clip_range=tuple(args.reward_clip_range),
        reward_nan_policy=args.reward_nan_policy,
        overlong_buffer_len=args.overlong_buffer_len,
        overlong_penalty_factor=args.overlong_penalty_factor,
        stop_properly_penalty_coef=args.stop_properly_penalty_coef,
        normalize_reward=args.normalize_reward,
        kl_estimator=args.kl_estimator,
        use_kl_loss=args.use_kl_loss,
    )


def sync_backend(args, use_gpu: bool) -> str:
    """The weight-sync backend this run uses. --vllm_sync_backend nccl is OpenRLHF's default and so in every
    script; where NCCL cannot run it is replaced, with a one-line notice: without GPUs by gloo (the same
    broadcast; 1.2x / 1.9x faster than the object store for the toy / a 100M model here: docs/benchmarks.md),
    and by the object store when the engines share the policy's GPUs (--colocate_all_models: NCCL refuses
    two ranks on one GPU) or --rollout_staleness needs older weights kept (only the object store keeps them).
    An explicit gloo with --rollout_staleness is an error (train_ppo_ray.py)."""
    if args.vllm_sync_with_ray or args.vllm_sync_backend == "object_store":
        return "object_store"
    if args.rollout_staleness > 0:
        chosen, why = "object_store", "--rollout_staleness needs older weights kept"
    elif args.vllm_sync_backend == "gloo":
        return "gloo"
    elif not use_gpu:
        chosen, why = "gloo", "no GPUs"
    elif args.colocate_all_models:
        chosen, why = "object_store", "--colocate_all_models puts engines on the policy's GPUs"
    else:
        return "nccl"
    print(f"[weight sync] {args.vllm_sync_backend}: {why}; syncing with {chosen} (--vllm_sync_backend)", flush=True)
    return chosen


def lora_settings(args) -> LoraSettings | None:
    if not args.lora_rank:
        return None
    return LoraSettings(args.lora_rank, args.lora_alpha, args.target_modules, args.lora_dropout)


def logical_cpus(args) -> int:
    n = args.vllm_num_engines * args.vllm_tensor_parallel_size + args.actor_num_nodes * args.actor_num_gpus_per_node
    if args.needs_reference:
        n += args.ref_num_nodes * args.ref_num_gpus_per_node
    if args.needs_critic:
        n += args.critic_num_nodes * args.critic_num_gpus_per_node
    if args.absolute_zero and args.selfplay_judge_pretrain:
        n += 1
    return n + 2


def cpu_threads(args, use_gpu: bool) -> tuple[dict | None, dict | None]:
    """(engine env, trainer env): the thread count of each CPU actor under --async_train, where engines and
    trainer ranks run at the same time. The cores are split in two halves, the engines' split over the
    engines, the trainer's over the policy ranks (reference and critic ranks run when the policy's do not,
    and take the same count). None: the default, every core for each actor (synchronous: phases alternate)."""
    if use_gpu or not args.async_train:
        return None, None
    import os

    cores = os.cpu_count() or 1
    engine_cores = max(1, cores // 2)
    ranks = args.actor_num_nodes * args.actor_num_gpus_per_node
    per_engine = max(1, engine_cores // (args.vllm_num_engines * args.vllm_tensor_parallel_size))
    per_rank = max(1, (cores - engine_cores) // ranks)
    return {"REINFORCE_PRO_CPU_THREADS": str(per_engine)}, {"REINFORCE_PRO_CPU_THREADS": str(per_rank)}


def with_log_dir(env: dict | None, plan) -> dict | None:
    """`env` plus where the actors write their output (workers/base.py: capture_output): the run's logs/
    directory, or nothing with --verbose (plan.log_dir None), which leaves it on the console."""
    if plan.log_dir is None:
        return env
    return {**(env or {}), LOG_DIR_ENV: str(plan.log_dir)}


def build_groups(args, plan, use_gpu: bool, total_steps: int, engines=None) -> dict:
    """Placement groups and actors for every role the flags ask for; `engines` reuses existing engines."""
    groups: dict = {"owned_engines": engines is None, "pgs": []}

    def new_pg(spec: GroupSpec):
        pg = make_placement_group(spec, use_gpu)
        groups["pgs"].append(pg)
        return pg

    actor_spec = GroupSpec("actor", args.actor_num_nodes, args.actor_num_gpus_per_node)
    actor_pg = new_pg(actor_spec)
    engine_env, trainer_env = (with_log_dir(env, plan) for env in cpu_threads(args, use_gpu))
    colocate_all = args.colocate_all_models
    colocate_ref = args.colocate_actor_ref or colocate_all
    share = 0.4 if colocate_all else (0.5 if colocate_ref and args.needs_reference else 1.0)
    opt = optim_config(args, "actor", actor_spec.size, total_steps)
    loss = policy_loss_config(args)
    attn = {"attn_implementation": attn_implementation(args)}
    forward_budget = {"forward_max_tokens": rollout_max_tokens(args), "packing_samples": args.packing_samples}
    fwd = {**attn, "forward_micro_batch_size": args.micro_rollout_batch_size, **forward_budget}
    groups["policy"] = create_group(
        PolicyWorker,
        actor_spec,
        actor_pg,
        use_gpu,
        share,
        lambda d: (plan.pretrain, opt, loss, d, args.seed, fwd, lora_settings(args)),
        trainer_env,
    )
    groups["reference"] = None
    if args.needs_reference:
        ref_spec = actor_spec if colocate_ref else GroupSpec("ref", args.ref_num_nodes, args.ref_num_gpus_per_node)
        ref_pg = actor_pg if colocate_ref else new_pg(ref_spec)
        ref_args = (
            plan.pretrain, args.micro_rollout_batch_size, args.temperature, args.param_dtype, {**attn, **forward_budget}
        )  # fmt: skip
        ref_share = 0.3 if colocate_all else share
        groups["reference"] = create_group(
            ReferenceWorker, ref_spec, ref_pg, use_gpu, ref_share, lambda d: ref_args, trainer_env
        )
    groups["critic"] = None
    if args.needs_critic:
        spec = GroupSpec("critic", args.critic_num_nodes, args.critic_num_gpus_per_node)
        critic_opt = optim_config(args, "critic", spec.size, total_steps)
        pretrain = args.critic_pretrain or plan.pretrain
        head = args.value_head_prefix
        groups["critic_pg"] = new_pg(spec)
        critic_share = 0.5 if args.colocate_critic_reward else 1.0  # the other half: the reward model
        groups["critic"] = create_group(
            CriticWorker, spec, groups["critic_pg"], use_gpu, critic_share,
            lambda d: (pretrain, critic_opt, d, args.seed, args.value_clip, head, fwd), trainer_env,
        )  # fmt: skip
    engine_cfg = EngineConfig(
        model_path=plan.pretrain,
        dtype=engine_dtype(args),
        seed=args.seed,
        tensor_parallel_size=args.vllm_tensor_parallel_size,
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        enable_prefix_caching=args.enable_prefix_caching,
        max_model_len=args.max_len,
        cpu_kv_cache_gib=args.vllm_cpu_kvcache_gib,
    )
    groups["engines"] = engines or [
        ray.remote(VLLMEngine).options(**engine_options(args, use_gpu, actor_pg, i, engine_env)).remote(engine_cfg, i)
        for i in range(args.vllm_num_engines)
    ]
    return groups


def rollout_max_tokens(args) -> int | None:
    """Token budget of the log-prob / value forwards under --use_dynamic_batch (OpenRLHF: twice the training
    budget when not given); None: --micro_rollout_batch_size rows at a time."""
    if not args.use_dynamic_batch:
        return None
    return args.rollout_max_tokens_per_gpu or 2 * args.train_max_tokens_per_gpu


def engine_options(args, use_gpu: bool, actor_pg, index: int, env: dict | None = None) -> dict:
    """A whole GPU per tensor-parallel rank, or with --colocate_all_models 0.3 of a policy bundle; `env`:
    environment variables of the engine's process (cpu_threads)."""
    extra = env_options(env)
    if not args.colocate_all_models:
        return {"num_cpus": 1, "num_gpus": args.vllm_tensor_parallel_size if use_gpu else 0, **extra}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = (index % (args.actor_num_nodes * args.actor_num_gpus_per_node)) // args.actor_num_gpus_per_node
    strategy = PlacementGroupSchedulingStrategy(placement_group=actor_pg, placement_group_bundle_index=bundle)
    return {"num_cpus": 0.3, "num_gpus": 0.3 if use_gpu else 0, "scheduling_strategy": strategy, **extra}


# The actor roles a run creates itself (engines may be passed in and are released only when owned).
RUN_ACTORS = ("policy", "reference", "critic", "reward_model", "judge")


def record_placement(groups: dict, run_dir: Path) -> dict:
    """Where every actor of the run landed ({role: [{"node_id", "ip"} per rank / engine]}), written to
    placement.json in the run directory and summarised in one line."""
    roles = {key: groups.get(key) for key in (*RUN_ACTORS, "engines")}
    placement = {role: [node_of(a) for a in actors] for role, actors in roles.items() if actors}
    (run_dir / "placement.json").write_text(json.dumps(placement, indent=1))
    summary = ", ".join(
        f"{role} {len(where)} on {len({w['node_id'] for w in where})} node(s)" for role, where in placement.items()
    )
    print(f"[placement] {summary} ({run_dir / 'placement.json'})", flush=True)
    return placement


def release_groups(groups: dict) -> None:
    """Kill the actors this run created and free its placement groups (the cluster may outlive the run)."""
    from ray.util import remove_placement_group

    owned = [a for key in RUN_ACTORS for a in (groups.get(key) or [])]
    if groups.get("owned_engines"):
        owned += groups["engines"]
    for actor in owned:
        ray.kill(actor)
    for pg in groups["pgs"]:
        remove_placement_group(pg)


def reward_function(args, plan, use_gpu: bool, groups: dict):
    if plan.reward_source == "builtin:exact_match":
        return exact_match_reward
    if plan.reward_source.startswith("model:"):
        extra = env_options(with_log_dir(None, plan))
        share = 1
        if args.colocate_critic_reward:  # in the critic's first slot, beside critic rank 0
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            share = 0.5
            extra["scheduling_strategy"] = PlacementGroupSchedulingStrategy(groups["critic_pg"], 0)
        rm = ray.remote(RewardModelWorker).options(num_cpus=share, num_gpus=share if use_gpu else 0, **extra)
        actor = rm.remote(args.reward_pretrain, args.micro_rollout_batch_size)
        groups["reward_model"] = [actor]
        return lambda queries, prompts, labels: ray.get(actor.score.remote(queries))
    return load_reward_func(plan.reward_source)


def selfplay_source(args, plan, groups, sampler: Sampler, use_gpu: bool):
    """The Absolute-Zero rollout source, with its task, weights and (optionally) a judge engine."""
    from reinforce_pro.selfplay.controller import SelfPlayConfig
    from reinforce_pro.selfplay.source import SelfPlaySource

    flag_weights = {"safety": args.safety_reward_weight, "completion": args.task_completion_weight}
    cfg = SelfPlayConfig(
        n_questions_per_prompt=args.n_questions_per_prompt,
        n_samples_per_prompt=args.n_samples_per_prompt,
        max_repropose_attempts=args.max_repropose_attempts,
        proposer_train_scope=args.proposer_train_scope,
        weights={d: flag_weights.get(d, w) for d, w in plan.task.weights.items()},
        format_reward_coef=args.format_reward_coef,
        proposer_reward_coef=args.proposer_reward_coef,
    )
    judge = None
    if args.selfplay_judge_pretrain:
        judge_cfg = EngineConfig(
            model_path=args.selfplay_judge_pretrain, dtype=engine_dtype(args), seed=args.seed,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization, max_model_len=args.max_len,
            cpu_kv_cache_gib=args.vllm_cpu_kvcache_gib,
        )  # fmt: skip
        options = {"num_cpus": 1, "num_gpus": 1 if use_gpu else 0, **env_options(with_log_dir(None, plan))}
        judge = [ray.remote(VLLMEngine).options(**options).remote(judge_cfg, 0, "judge")]
        groups["judge"] = judge
    return SelfPlaySource(sampler, plan.task, cfg, seed=args.seed, judge_engines=judge)


def loop_config(args, run_dir: Path) -> LoopConfig:
    checkpoints = None
    if args.save_steps > 0 or args.load_checkpoint:
        checkpoints = CheckpointConfig(
            ckpt_path=Path(args.ckpt_path).resolve(),
            save_steps=args.save_steps,
            max_ckpt_num=args.max_ckpt_num,
            max_ckpt_mem=args.max_ckpt_mem,
            save_hf_ckpt=args.save_hf_ckpt,
            disable_ds_ckpt=args.disable_ds_ckpt,
        )
    return LoopConfig(
        num_episodes=args.num_episodes,
        rollout_batch_size=args.rollout_batch_size,
        train_batch_size=args.train_batch_size,
        micro_train_batch_size=args.micro_train_batch_size,
        train_max_tokens=args.train_max_tokens_per_gpu if args.use_dynamic_batch else None,
        packing_samples=args.packing_samples,
        max_epochs=args.max_epochs,
        freezing_actor_steps=args.freezing_actor_steps,
        logging_steps=args.logging_steps,
        seed=args.seed,
        sync_dtype=engine_dtype(args),
        sync_backend=args.sync_backend_resolved,
        sync_bucket_mb=args.vllm_sync_bucket_mb,
        engine_tp_size=args.vllm_tensor_parallel_size,
        rollout_staleness=args.rollout_staleness,
        dynamic_filtering_reward_range=tuple(args.dynamic_filtering_reward_range) if args.dynamic_filtering else None,
        eval_steps=args.eval_steps,
        eval_before_training=args.eval_before_training,
        samples_log_steps=args.samples_log_steps,
        recompute_old_log_probs=args.recompute_old_log_probs,
        async_train=args.async_train,
        async_queue_size=args.async_queue_size,
        partial_rollout_chunk=args.partial_rollout_chunk if args.partial_rollout else None,
        best_metric_key=args.best_metric_key or None,
        best_model_dir=run_dir / "best_model",
        checkpoints=checkpoints,
    )


def eval_set(args, tokenizer) -> EvalSet | None:
    """--eval_dataset read like --prompt_data (same keys and template)."""
    if not args.eval_dataset:
        return None
    records = load_records(args.eval_dataset, args.eval_split)
    label_key = args.label_key or ("label" if args.prompt_data is None else None)  # built-in data has labels
    spec = PromptSpec(args.input_key, label_key, args.input_template, args.apply_chat_template)
    prompts = build_prompts(records, spec, tokenizer, args.eval_dataset)
    name = Path(args.eval_dataset).stem
    return EvalSet(name, prompts, args.eval_n_samples_per_prompt, args.eval_temperature)


def wandb_config(args) -> WandbConfig | None:
    if not args.use_wandb:
        return None
    config = {k: v for k, v in vars(args).items() if k != "use_wandb"}  # never the API key
    return WandbConfig(
        args.use_wandb, args.wandb_project, args.wandb_group, args.wandb_run_name, args.wandb_org, config
    )


def resume_checkpoint(args, plan) -> Path | None:
    """With --load_checkpoint: the latest complete checkpoint (None: start from scratch). The run's jsonl
    files are cut back to its step, so the resumed run appends to them without duplicates."""
    if not args.load_checkpoint:
        return None
    ckpt = find_latest(Path(args.ckpt_path).resolve())
    if ckpt is None:
        print(f"[resume] no complete checkpoint in {args.ckpt_path}: starting from scratch", flush=True)
        return None
    step = load_state(ckpt)["step"]
    for path in plan.run_dir.glob("*.jsonl"):  # every per-step file the run writes (MetricsLogger.write)
        truncate_jsonl(path, step)
    return ckpt


def agent_source(args, agent_cls: type, sampler: Sampler):
    """Multi-turn rollouts with the user's AgentInstance (--agent_func_path)."""
    from reinforce_pro.agents.runner import AgentConfig
    from reinforce_pro.agents.source import AgentSource

    cfg = AgentConfig(
        max_turns=args.agent_max_turns,
        max_len=args.max_len,
        prompt_max_len=args.prompt_max_len,
        reward_mode=args.agent_reward_mode,
    )
    return AgentSource(sampler, agent_cls, cfg)


# OpenRLHF frees GPU memory between phases with these; a CPU run has nothing to free (engines and trainer hold
# host memory, which sleeping would only hand back to the same process).
SLEEP_FLAGS = {"vllm_enable_sleep": "vLLM sleep mode", "deepspeed_enable_sleep": "DeepSpeed state offload"}


def check_sleep_flags(args, use_gpu: bool) -> None:
    """On CPU: accepted, a one-line notice each, training unchanged. On GPU: not implemented, one line."""
    for flag, what in SLEEP_FLAGS.items():
        if not getattr(args, flag):
            continue
        if use_gpu:
            from reinforce_pro.cli.run import UserInputError

            raise UserInputError(f"--{flag} ({what}) is not implemented on GPU yet: drop it")
        print(f"[notice] --{flag}: a CPU run has no device memory to free; accepted, training unchanged", flush=True)


def build_and_fit(args, plan, engines=None) -> list[dict]:
    """Start (or join) Ray, create the groups, run fit(), save the final model. `engines` lets callers
    (the end-to-end tests) share already-started rollout engines."""
    from transformers import AutoTokenizer

    start_ray(logical_cpus(args))
    use_gpu = gpus_available()
    check_sleep_flags(args, use_gpu)
    args.sync_backend_resolved = sync_backend(args, use_gpu)
    total_steps = optimizer_steps(args, len(plan.prompts))
    if plan.log_dir is not None:
        print(f"[logs] engine and worker output: {plan.log_dir}/ (--verbose: on the console)", flush=True)
    groups = build_groups(args, plan, use_gpu, total_steps, engines)
    if args.lora_rank:  # the policy's own line goes to its log file: say it here too
        summary = ray.get(groups["policy"][0].__ray_call__.remote(lambda w: trainable_summary(w.engine.module)))
        print(f"[lora] rank {args.lora_rank}, alpha {args.lora_alpha}: {summary}", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(plan.pretrain, use_fast=not args.disable_fast_tokenizer)
    kl_ctl = build_kl_controller(args.init_kl_coef, args.kl_target, args.kl_horizon)
    # self-play tasks and agent environments score their own rollouts: no reward function
    reward_fn = None if plan.task or plan.agent_cls else reward_function(args, plan, use_gpu, groups)
    rollout_cfg = rollout_config(args)
    builder = ExperienceBuilder(groups["policy"], groups["reference"], groups["critic"], reward_fn, rollout_cfg, kl_ctl)
    sampler = Sampler(groups["engines"], tokenizer, rollout_cfg)
    if plan.task is not None:
        source = selfplay_source(args, plan, groups, sampler, use_gpu)
    elif plan.agent_cls is not None:
        source = agent_source(args, plan.agent_cls, sampler)
    else:
        source = PromptSource(sampler)
    logger = None
    try:
        resume_from = resume_checkpoint(args, plan)  # before the logger opens the jsonl files it truncates
        record_placement(groups, plan.run_dir)
        logger = MetricsLogger(plan.run_dir, args.use_tensorboard, wandb_cfg=wandb_config(args))
        trainer = PPOTrainer(
            source, builder, groups["policy"], groups["critic"], groups["engines"], plan.prompts, logger,
            loop_config(args, plan.run_dir), eval_set(args, tokenizer),
        )  # fmt: skip
        if resume_from is not None:
            trainer.restore(resume_from)
            print(f"[resume] from {resume_from} at step {trainer.step}", flush=True)
        history = trainer.fit()
        ray.get([p.save_hf.remote(str(plan.run_dir / "final_model")) for p in groups["policy"]])
        if args.lora_save_merged:
            ray.get([p.save_hf.remote(str(plan.run_dir / "final_model_merged"), True) for p in groups["policy"]])
        if args.save_value_network and groups["critic"]:
            ray.get([c.save.remote(str(plan.run_dir / "final_critic")) for c in groups["critic"]])
    finally:
        if logger is not None:
            logger.close()
        release_groups(groups)
    return history
