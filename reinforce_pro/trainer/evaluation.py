"""Held-out evaluation (--eval_dataset, --eval_steps): k samples per prompt at --eval_temperature, scored by
the run's reward function. pass@k is the mean over prompts of the best score among the k samples (the
usual pass@k when scores are 0/1); reward_mean averages every sample.

With --agent_func_path a sample is an episode of the agent, scored as in training (the environment's last score,
or the run's reward function when an OpenAI-SDK agent returns no reward); an episode that fails scores 0, so a
failing agent cannot raise its own number by dropping out. Its length is the tokens the model sampled."""

from __future__ import annotations

from collections.abc import Callable

import torch

from reinforce_pro.rewards.loader import RewardOutput
from reinforce_pro.rollout.sampler import Sampler, sampling_params


def eval_metric_names(name: str, n: int) -> list[str]:
    """The keys `evaluate` returns for eval set `name` with `n` samples per prompt."""
    return [
        f"eval/{name}/{m}" for m in (f"pass@{n}", "score_mean", "reward_mean", "response_length_mean", "num_prompts")
    ]


def evaluate(
    sampler: Sampler, score: Callable[..., RewardOutput], prompts: list[dict], name: str, n: int, temperature: float
) -> dict[str, float]:
    """`prompts`: [{"prompt", "label"}]; `score`: ExperienceBuilder.score. Returns eval/<name>/{pass@n, ...}."""
    texts = [p["prompt"] for p in prompts for _ in range(n)]
    labels = [p["label"] for p in prompts for _ in range(n)]
    sampling = {**sampling_params(sampler.cfg), "temperature": temperature}
    _, generations, responses = sampler.sample_texts(texts, sampling)
    out = score(texts, responses, labels)
    lengths = torch.tensor([float(len(g.token_ids)) for g in generations])
    return summarise(name, n, out.scores, out.rewards, lengths)


def evaluate_agent(source, score: Callable[..., RewardOutput], prompts: list[dict], name: str, n: int,
                   temperature: float) -> dict[str, float]:  # fmt: skip
    """The same metrics over n episodes per prompt of the run's agent (`source`: AgentSource or
    OpenAIAgentSource, whose `evaluate` runs them without training anything)."""
    scores, rewards, lengths = source.evaluate(prompts, n, temperature, score)
    logs = {f"eval/{name}/logs/{k}": v for k, v in getattr(source, "eval_logs", {}).items()}
    return {**summarise(name, n, scores, rewards, lengths), **logs}


def summarise(name: str, n: int, scores: torch.Tensor, rewards: torch.Tensor, lengths: torch.Tensor) -> dict:
    """eval/<name>/*: scores, rewards and lengths are flat, n per prompt in prompt order."""
    prompts = len(scores) // n
    best = scores.view(prompts, n).max(dim=1).values.mean()
    values = [best, scores.mean(), rewards.mean(), lengths.mean(), prompts]
    return {key: float(v) for key, v in zip(eval_metric_names(name, n), values, strict=True)}
