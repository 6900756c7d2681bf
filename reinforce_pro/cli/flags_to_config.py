"""Flags -> the run's typed config (run/config.py: RunConfig), read once.

    flags (cli/args.py) -> run_config(args) -> RunConfig -> train (run/driver.py)

Each RunConfig section is built by one function of `SECTIONS`. A field named after a flag (its argparse dest)
is filled from that flag: the builder says which dataclasses it fills so (`@fills(...)`, then `named(cls,
flags, ...)`), and its parameters name only the flags it computes the other fields from. The table "flag ->
section" is therefore the builders' signatures and the fields of what they fill: `flag_sections()` derives it,
docs/flags.md prints it, and tests/test_config.py checks that every flag is read by some section, refused
(args.UNSUPPORTED) or listed with why it has no effect (args.NO_EFFECT); nothing is accepted and silently
ignored. The flags are checked before any builder runs (cli/args.py: bounds on each flag's field, RULES between
flags), so a builder only converts; what it still refuses (KEY=VALUE settings that do not parse, a section's
guard for callers without a command line) ends the command line in one line too.

Values only known once the run starts are filled in by run/start.start_config with dataclasses.replace:
the policy's starting weights (after the warm start: `Engines.config.model_path`), the optimizer's step
count (`OptimConfig.total_steps`, from the number of prompts), the weight-sync backend the machine allows
(`LoopConfig.sync_backend`) and the run directory; the loop's copies of engine settings (`sync_dtype`, ...)
are taken from the engines section there, so each is set in one place.
"""

from __future__ import annotations

import dataclasses
import inspect
from argparse import Namespace
from datetime import datetime
from pathlib import Path

from reinforce_pro.agents.runner import AgentConfig
from reinforce_pro.algos.distill import DistillConfig
from reinforce_pro.algos.is_correction import openrlhf_correction
from reinforce_pro.algos.losses import SurrogateConfig
from reinforce_pro.cli.args import (
    DEFAULT_CKPT_PATH,
    DEFAULT_MAX_NEW_TOKENS,
    engine_dtype,
    flag_fields,
    response_budget,
    threshold_band,
)
from reinforce_pro.models.lora import LoraAdapterConfig
from reinforce_pro.models.sampling_filter import SamplingFilter
from reinforce_pro.rollout.sampler import RolloutConfig
from reinforce_pro.rollout.vllm_engine import EngineConfig
from reinforce_pro.run import config as sections
from reinforce_pro.selfplay.controller import SelfPlayConfig
from reinforce_pro.trainer.experience_builder import ExperienceConfig
from reinforce_pro.trainer.logger import WandbConfig
from reinforce_pro.trainer.ppo_trainer import CheckpointConfig, LoopConfig
from reinforce_pro.workers.configs import ForwardConfig, OptimConfig
from reinforce_pro.workers.launcher import GroupSpec
from reinforce_pro.workers.policy import PolicyLossConfig


def fills(*classes):
    """Marks a builder whose dataclasses `classes` take each field from the flag of the same name, unless the
    builder computes it: run_config hands it the parsed flags as `flags`, for `named`."""

    def mark(builder):
        builder.fills = classes
        return builder

    return mark


def named(cls, flags: Namespace, **computed):
    """`cls` from `computed` and, for each of its other fields, the flag of the same name; a field with neither
    keeps its default."""
    names = {f.name for f in dataclasses.fields(cls)} - set(computed)
    return cls(**{name: getattr(flags, name) for name in names if name in vars(flags)}, **computed)


# ------------------------------------------------------------------------------------------------ sections
# Each builder's parameters are flag dests (and `flags`, for what it fills); run_config passes exactly those. A
# section whose fields are all flags (Data) is its own builder.


def seed(seed):
    return seed


def placement(
    actor_num_nodes, actor_num_gpus_per_node, ref_num_nodes, ref_num_gpus_per_node, critic_num_nodes,
    critic_num_gpus_per_node, colocate_actor_ref, colocate_critic_reward, colocate_all_models,
) -> sections.Placement:  # fmt: skip
    return sections.Placement(
        GroupSpec("actor", actor_num_nodes, actor_num_gpus_per_node),
        GroupSpec("ref", ref_num_nodes, ref_num_gpus_per_node),
        GroupSpec("critic", critic_num_nodes, critic_num_gpus_per_node),
        colocate_actor_ref, colocate_critic_reward, colocate_all_models,
    )  # fmt: skip


@fills(EngineConfig)
def engines(
    flags, vllm_num_engines, vllm_tensor_parallel_size, vllm_dtype, param_dtype, vllm_gpu_memory_utilization,
    max_len, vllm_cpu_kvcache_gib, vllm_sync_backend, vllm_sync_with_ray, vllm_sync_bucket_mb, vllm_enable_sleep,
    deepspeed_enable_sleep, vllm_quantization, fp32_lm_head,
) -> sections.Engines:  # fmt: skip
    config = named(
        EngineConfig, flags, model_path="", dtype=engine_dtype(vllm_dtype, param_dtype),
        tensor_parallel_size=vllm_tensor_parallel_size, gpu_memory_utilization=vllm_gpu_memory_utilization,
        max_model_len=max_len, cpu_kv_cache_gib=vllm_cpu_kvcache_gib, quantization=vllm_quantization,
        fp32_head=fp32_lm_head,
    )  # fmt: skip
    sleep = {"vllm_enable_sleep": vllm_enable_sleep, "deepspeed_enable_sleep": deepspeed_enable_sleep}
    return sections.Engines(
        count=1 if vllm_num_engines is None else vllm_num_engines,  # unset: one engine
        config=config,
        sync_backend="object_store" if vllm_sync_with_ray else vllm_sync_backend,
        sync_bucket_mb=vllm_sync_bucket_mb,
        sleep_flags=tuple(flag for flag, on in sleep.items() if on),
    )


@fills(ForwardConfig)
def forward(
    flags, micro_rollout_batch_size, use_dynamic_batch, rollout_max_tokens_per_gpu, train_max_tokens_per_gpu,
    ring_attn_size,
) -> ForwardConfig:  # fmt: skip
    # OpenRLHF: the scoring forwards' budget is twice the training one when not given
    budget = (rollout_max_tokens_per_gpu or 2 * train_max_tokens_per_gpu) if use_dynamic_batch else None
    return named(ForwardConfig, flags, micro_batch_size=micro_rollout_batch_size, max_tokens=budget,
                 ring_size=ring_attn_size)  # fmt: skip


def _optim(flags: Namespace, world: int, micro: int, batch: int, **computed) -> OptimConfig:
    """An optimizer's settings: `computed`, else the flags of the same names; its `world` ranks accumulate
    micro-batches of `micro` (--micro_train_batch_size) up to `batch` (--train_batch_size)."""
    return named(OptimConfig, flags, **computed, micro_batch_size=micro, grad_accum_steps=batch // (micro * world))


@fills(OptimConfig)
def actor_optim(
    flags, actor_learning_rate, adam_betas, actor_num_nodes, actor_num_gpus_per_node, micro_train_batch_size,
    train_batch_size,
) -> OptimConfig:  # fmt: skip
    world = actor_num_nodes * actor_num_gpus_per_node
    return _optim(flags, world, micro_train_batch_size, train_batch_size, learning_rate=actor_learning_rate,
                  adam_betas=tuple(adam_betas))  # fmt: skip


@fills(OptimConfig)
def critic_optim(
    flags, critic_learning_rate, critic_adam_betas, critic_adam_eps, critic_l2, critic_lr_scheduler,
    critic_lr_warmup_ratio, critic_min_lr_ratio, critic_max_norm, critic_num_nodes, critic_num_gpus_per_node,
    micro_train_batch_size, train_batch_size,
) -> OptimConfig:  # fmt: skip
    """The critic's dotted-only settings (--critic.adam.betas, ...) left unset follow the policy's, as
    v0.9.10's shared flags did."""
    shared = ("adam_betas", "adam_eps", "l2", "lr_scheduler", "lr_warmup_ratio", "min_lr_ratio", "max_norm")
    given = locals()
    own = {n: getattr(flags, n) if given[f"critic_{n}"] is None else given[f"critic_{n}"] for n in shared}
    own["adam_betas"] = tuple(own["adam_betas"])
    world = critic_num_nodes * critic_num_gpus_per_node
    return _optim(flags, world, micro_train_batch_size, train_batch_size, learning_rate=critic_learning_rate, **own)


@fills(SurrogateConfig, PolicyLossConfig)
def loss(
    flags, eps_clip, eps_clip_low_high, enable_vllm_is_correction, vllm_is_truncated_threshold,
    vllm_is_correction_type, vllm_is_correction_args, is_correction_level, is_correction_mode, is_correction_gating,
    is_position_metrics, loss_agg_mode, top_p, top_k, min_new_tokens,
) -> PolicyLossConfig:  # fmt: skip
    low, high = eps_clip_low_high or (eps_clip, eps_clip)  # --eps_clip_low_high unset: symmetric --eps_clip
    # OpenRLHF 0.11.2's spelling of the same choice (--algo.advantage.is_correction_level) enables it
    chosen = openrlhf_correction(is_correction_level, is_correction_mode, is_correction_gating)
    surrogate = named(
        SurrogateConfig, flags, clip_eps_low=low, clip_eps_high=high, token_level_loss=loss_agg_mode == "token-mean",
        enable_vllm_is_correction=enable_vllm_is_correction or chosen is not None,
        vllm_is_truncated_threshold=threshold_band(vllm_is_truncated_threshold),
        vllm_is_correction_type=chosen or vllm_is_correction_type, position_metrics=is_position_metrics,
        vllm_is_correction_args=_key_values("--vllm_is_correction_args", vllm_is_correction_args),
    )  # fmt: skip
    # the trainer scores the distribution the engine samples from: its filters, replayed (models/sampling_filter.py);
    # a minimum length acts once the workers add the model's stop ids (with_engine_stop_ids)
    replay = SamplingFilter(top_k=top_k, top_p=top_p, min_tokens=min_new_tokens)
    return named(PolicyLossConfig, flags, surrogate=surrogate,
                 sampling_filter=replay if replay.active or min_new_tokens else None)  # fmt: skip


def _key_values(flag: str, items: list[str] | None) -> dict[str, float]:
    """KEY=VALUE strings -> {KEY: float(VALUE)}; one line naming the flag for anything else."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not (sep and key and number is not None):
            raise ValueError(f"{flag} takes KEY=VALUE with a number as VALUE, got {item!r}")
        out[key] = number
    return out


def kl(init_kl_coef, kl_target, kl_horizon) -> sections.KLPenalty:
    return sections.KLPenalty(init_kl_coef, kl_target, kl_horizon)


@fills(RolloutConfig)
def rollout(flags, max_new_tokens, max_len) -> RolloutConfig:
    return named(RolloutConfig, flags, max_new_tokens=response_budget(max_new_tokens, max_len))


@fills(ExperienceConfig)
def experience(flags, max_new_tokens, max_len, no_advantage_std_norm, reward_clip_range) -> ExperienceConfig:
    return named(
        ExperienceConfig, flags, max_new_tokens=response_budget(max_new_tokens, max_len),
        std_norm=not no_advantage_std_norm, reward_clip_range=tuple(reward_clip_range),
    )  # fmt: skip


@fills(LoopConfig, CheckpointConfig)
def loop(
    flags, use_dynamic_batch, train_max_tokens_per_gpu, dynamic_filtering, dynamic_filtering_reward_range,
    partial_rollout, partial_rollout_chunk, max_new_tokens, best_metric_key, save_steps, load_checkpoint, ckpt_path,
    auto_checkpoint_minutes,
) -> LoopConfig:  # fmt: skip
    checkpoints = None
    every_s = auto_checkpoint_minutes * 60 if save_steps <= 0 else 0.0  # the default, by the clock
    if save_steps > 0 or load_checkpoint or every_s > 0:
        # by the clock alone, or --ckpt_path not given: under the run directory, once the driver knows it
        # (run/resume.run_checkpoints), so two runs never share one (OpenRLHF's default, ./ckpt/checkpoints_ppo_ray,
        # put every run's there, and a run could resume, or rotate away, another's)
        given = ckpt_path != DEFAULT_CKPT_PATH
        path = Path(ckpt_path).resolve() if (save_steps > 0 or load_checkpoint) and given else None
        checkpoints = named(CheckpointConfig, flags, ckpt_path=path, resume=load_checkpoint, every_s=every_s)
    chunk = None
    if partial_rollout:  # default chunk: a quarter of the response budget
        chunk = partial_rollout_chunk or max(1, (max_new_tokens or DEFAULT_MAX_NEW_TOKENS) // 4)
    # sync_*, engine_tp_size: the engines section's, best_model_dir: <run dir>/best_model (start_config)
    return named(
        LoopConfig, flags, checkpoints=checkpoints,
        train_max_tokens=train_max_tokens_per_gpu if use_dynamic_batch else None,
        dynamic_filtering_reward_range=tuple(dynamic_filtering_reward_range) if dynamic_filtering else None,
        partial_rollout_chunk=chunk, best_metric_key=best_metric_key or None,
    )  # fmt: skip


@fills(sections.Models)
def models(flags, lora_rank, lora_alpha, target_modules, lora_dropout) -> sections.Models:
    lora = LoraAdapterConfig(lora_rank, lora_alpha, target_modules, lora_dropout) if lora_rank else None
    return named(sections.Models, flags, lora=lora)


def evaluation(eval_dataset, eval_split, eval_n_samples_per_prompt, eval_temperature) -> sections.Evaluation | None:
    if not eval_dataset:
        return None
    return sections.Evaluation(eval_dataset, eval_split, eval_n_samples_per_prompt, eval_temperature)


@fills(SelfPlayConfig)
def selfplay(
    flags, absolute_zero, selfplay_task, selfplay_task_path, selfplay_kb, selfplay_retriever_url,
    selfplay_judge_pretrain, selfplay_reference_buffer, proposer_repetition_penalty, safety_reward_weight,
    task_completion_weight,
) -> sections.SelfPlay | None:  # fmt: skip
    if not absolute_zero:
        return None
    weights = {"safety": safety_reward_weight, "completion": task_completion_weight}
    config = named(SelfPlayConfig, flags, weights=weights, reference_buffer=selfplay_reference_buffer,
                   repetition_penalty=proposer_repetition_penalty)  # fmt: skip
    return sections.SelfPlay(
        selfplay_task, selfplay_task_path, selfplay_judge_pretrain, config, selfplay_kb, selfplay_retriever_url
    )


def agent(agent_func_path, agent_max_turns, max_len, prompt_max_len, agent_reward_mode) -> sections.Agent | None:
    if not agent_func_path:
        return None
    return sections.Agent(agent_func_path, AgentConfig(agent_max_turns, max_len, prompt_max_len, agent_reward_mode))


def output(
    save_path, verbose, use_tensorboard, use_wandb, wandb_project, wandb_group, wandb_run_name, wandb_org
) -> sections.Output:
    wandb = None
    if use_wandb:
        run_name = wandb_run_name or f"ppo_{datetime.now().strftime('%m%dT%H:%M')}"
        wandb = WandbConfig(use_wandb, wandb_project, wandb_group, run_name, wandb_org, {})
    return sections.Output(save_path, verbose, use_tensorboard, wandb)


@fills(DistillConfig)
def distill(flags, teacher_pretrain) -> DistillConfig | None:
    return named(DistillConfig, flags) if teacher_pretrain else None


# RunConfig field -> its builder, in RunConfig's order
SECTIONS = {
    "seed": seed,
    "placement": placement,
    "engines": engines,
    "forward": forward,
    "actor_optim": actor_optim,
    "critic_optim": critic_optim,
    "loss": loss,
    "kl": kl,
    "rollout": rollout,
    "experience": experience,
    "loop": loop,
    "models": models,
    "data": sections.Data,  # its fields are flags: the dataclass is its own builder
    "evaluation": evaluation,
    "selfplay": selfplay,
    "agent": agent,
    "output": output,
    "distill": distill,
}


def flags_of(builder) -> tuple[str, ...]:
    """The flags a builder reads: its parameters, and the fields of the dataclasses it fills that are flags."""
    dests = {f.name for _, f, _, _ in flag_fields()}
    filled = [f.name for cls in getattr(builder, "fills", ()) for f in dataclasses.fields(cls) if f.name in dests]
    return tuple(dict.fromkeys([p for p in inspect.signature(builder).parameters if p != "flags"] + filled))


def flag_sections() -> dict[str, list[str]]:
    """flag dest -> the RunConfig sections that read it (docs/flags.md's "config" column)."""
    table: dict[str, list[str]] = {}
    for section, builder in SECTIONS.items():
        for flag in flags_of(builder):
            table.setdefault(flag, []).append(section)
    return table


def run_config(args: Namespace) -> sections.RunConfig:
    """The one place that reads the namespace for the run. Raises ValueError for what a section refuses."""
    return sections.RunConfig(**{name: build(**flag_values(args, build)) for name, build in SECTIONS.items()})


def flag_values(args: Namespace, builder) -> dict:
    """A builder's arguments: the flags its parameters name, and the namespace itself as `flags`."""
    names = inspect.signature(builder).parameters
    return {name: args if name == "flags" else getattr(args, name) for name in names}
