"""The rollout source of `--agent_func_path`: the rollout is the multi-turn loop of agents/runner.py; the rest
(log-probs, KL, advantages, the loss) is the ordinary pipeline, which trains only action_mask tokens."""

from __future__ import annotations

import torch

from reinforce_pro.agents.episode import Episode, episodes_to_samples
from reinforce_pro.agents.runner import AgentConfig, AgentRunner
from reinforce_pro.experience import Samples
from reinforce_pro.rollout.sampler import PartialRollout, Sampler, pad_token_id, sampling_params, token_versions


class AgentSource:
    def __init__(self, sampler: Sampler, agent_cls: type, agent_cfg: AgentConfig):
        self.sampler, self.agent_cfg = sampler, agent_cfg
        self.partial: PartialRollout | None = None
        self.runner = AgentRunner(agent_cls, sampler.tokenizer, sampler.sample, sampling_params(sampler.cfg), agent_cfg)

    def state_dict(self) -> dict:
        return {}  # every episode starts from a fresh AgentInstance: nothing to carry over

    def load_state_dict(self, state: dict) -> None:
        pass

    def use_partial(self, partial: PartialRollout) -> None:
        """--partial_rollout: every model turn is sampled in chunks with weight syncs let in between, so an
        episode's tokens may come from several policy versions (as OpenRLHF's async agent script runs them);
        each token keeps the log-prob and the version of the weights that sampled it."""
        self.partial = partial
        self.runner.sample_in_chunks = lambda ids, sampling: self.sampler.sample_in_chunks(ids, partial, sampling)

    def generate(self, batch: list[dict], n: int) -> Samples:
        tokenizer = self.sampler.tokenizer
        dialogue = _dialogues(batch)
        episodes = self.runner.run_dialogues(batch, n) if dialogue else self.runner.run_episodes(batch, n)
        responses = [tokenizer.decode(e.tokens, skip_special_tokens=True) for e in episodes]
        samples = episodes_to_samples(episodes, pad_token_id(tokenizer), responses, self.agent_cfg.reward_mode)
        samples.metrics, samples.group_size = agent_metrics(episodes, dialogues=dialogue), n
        if self.partial is not None:
            samples.token_version = token_versions([e.versions for e in episodes], samples.num_actions)
        return samples

    def evaluate(self, batch: list[dict], n: int, temperature: float, score=None) -> tuple[torch.Tensor, ...]:
        """Held-out episodes (--eval_dataset), n per prompt at `temperature`, whole (never in chunks), trained on
        nothing: (last scores, summed rewards, tokens the model sampled), flat in prompt order."""
        sampling = {**self.runner.sampling, "temperature": temperature}
        runner = AgentRunner(self.runner.agent_cls, self.sampler.tokenizer, self.sampler.sample, sampling,
                             self.agent_cfg)  # fmt: skip
        episodes = runner.run_episodes(batch, n)  # plain prompts only (sources.eval_set refuses dialogues)
        scores = torch.tensor([e.turn_scores[-1] if e.turn_scores else 0.0 for e in episodes])
        rewards = torch.tensor([float(sum(e.turn_rewards)) for e in episodes])
        lengths = torch.tensor([float(sum(e.action)) for e in episodes])
        return scores, rewards, lengths


def _dialogues(batch: list[dict]) -> bool:
    dialogue = [isinstance(item["prompt"], list) for item in batch]
    if any(dialogue) and not all(dialogue):
        raise ValueError("a batch mixes dialogue records (a list of turns) with plain prompts: use one kind")
    return all(dialogue)


def agent_metrics(episodes: list[Episode], dialogues: bool) -> dict[str, float]:
    tokens = sum(len(e.tokens) for e in episodes)
    env_tokens = sum(a is False for e in episodes for a in e.action)
    turns = [len(e.turn_ends) for e in episodes]
    rewards = [r for e in episodes for r in e.step_rewards_ext.get("turn_rewards", [])]
    m = {
        "agent/turns_mean": sum(turns) / len(turns),
        "agent/env_token_frac": env_tokens / max(1, tokens),
        "agent/episode_tokens_mean": tokens / len(episodes),
        "agent/truncated_frac": sum(e.truncated for e in episodes) / len(episodes),
        "agent/turn_reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
    }
    if dialogues:
        m["agent/target_rows"] = float(len(episodes))
        m["agent/history_ops"] = float(sum(len(e.step_meta.get("op_log", [])) for e in episodes))
    return m
