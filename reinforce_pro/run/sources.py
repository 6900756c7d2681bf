"""What produces and scores a run's rollouts: the reward function, the rollout source (prompts, self-play, an
agent) and the held-out evaluation set."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import ray

from reinforce_pro.data import embedded_reward
from reinforce_pro.data.prompts import build_prompts, load_records
from reinforce_pro.rewards.builtin import exact_match_reward
from reinforce_pro.rewards.loader import load_reward_func
from reinforce_pro.rollout.sampler import PromptSource, Sampler
from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine
from reinforce_pro.run.actors import RunActors, with_log_dir
from reinforce_pro.run.config import RunConfig, RunPlan
from reinforce_pro.trainer.ppo_trainer import EvalSet
from reinforce_pro.workers.launcher import (
    SHARES,
    env_options,
)
from reinforce_pro.workers.reward_model import RewardModelWorker


def reward_function(cfg: RunConfig, plan: RunPlan, use_gpu: bool, groups: RunActors):
    if plan.reward_source == "none":  # pure distillation: the teacher's reverse KL is the only signal
        return lambda queries, prompts, labels: [0.0] * len(queries)
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
    label_key = data.label_key or ("label" if data.built_in else None)  # built-in data has labels
    spec = data.prompt_spec(data.input_key, label_key)
    prompts = build_prompts(records, spec, tokenizer, ev.dataset)
    agent = source if plan.agent_cls is not None else None
    if agent is not None and any(isinstance(p["prompt"], list) for p in prompts):
        raise ValueError(
            f"--eval_dataset {ev.dataset}: dialogue records (a list of turns) cannot be evaluated with "
            "--agent_func_path (a dialogue trains a row per target turn and has no one score)"
        )
    return EvalSet(Path(ev.dataset).stem, prompts, ev.n_samples, ev.temperature, agent)


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
