"""One episode as one token sequence: the prompt, then the model's and the environment's tokens in the
order they happened. Model tokens carry action_mask 1 and their rollout log-probs; environment tokens
carry action_mask 0 and log-prob 0, so the loss, the KL and the IS correction never see them.

On a mixture-of-experts engine every model turn also brings the experts each MoE layer picked for every
position that turn's call fed (rollout/route_capture.py); an episode keeps, per position, the routes of the
first call that fed it (experience.extend_routes): a turn's sampled tokens keep the routes they were sampled
under, and the environment's tokens get theirs from the next turn's call, which feeds them first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from reinforce_pro.experience import Samples, extend_routes, layout_routes, pad_rows
from reinforce_pro.rewards.loader import RewardOutput

REWARD_MODES = ("sum", "last", "per_turn")


@dataclass
class Episode:
    episode_id: int
    group_id: int  # episodes of one prompt share it (group-relative advantages)
    prompt: str
    label: object
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)  # everything after the prompt
    action: list[bool] = field(default_factory=list)  # per token: the model's (True) or the environment's
    log_probs: list[float] = field(default_factory=list)  # per token: rollout log-prob (0 for environment tokens)
    versions: list[int] = field(default_factory=list)  # per token: the engines' weight version that sampled it
    text: str = ""  # the episode's text so far (prompt included): the agent's observation_text
    turn_rewards: list[float] = field(default_factory=list)
    turn_scores: list[float] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)  # per turn: index in `tokens` of its last model token
    done: bool = False
    truncated: bool = False  # ended by the length or turn limit instead of the environment
    sampling: dict | None = None  # the agent's sampling params for the next turn (None: the run's)
    extra_logs: dict[str, list[float]] = field(default_factory=dict)
    step_meta: dict = field(default_factory=dict)  # sidecar exported with the experience (docs/agents.md)
    step_rewards_ext: dict = field(default_factory=dict)  # per-step rewards that do not enter the loss
    # (positions, L, K) int16 on an MoE engine: the routes of every context position a call fed, from the first
    # call that fed it; None: the engine captures none
    routes: torch.Tensor | None = None

    def context(self) -> list[int]:
        return self.prompt_ids + self.tokens

    def add_model(
        self, ids: list[int], log_probs: list[float], text: str, versions: list[int] | None = None, routes=None
    ) -> None:
        """One model turn sampled from `context()`; `routes`: what that call fed's routes ((positions, L, K),
        prompt first), None when the engine captures none."""
        self.routes = extend_routes(self.routes, routes)
        self.tokens += ids
        self.action += [True] * len(ids)
        self.log_probs += list(log_probs)
        self.versions += list(versions) if versions is not None else [0] * len(ids)
        self.text += text
        self.turn_ends.append(len(self.tokens) - 1)

    def add_environment(self, ids: list[int], text: str) -> None:
        self.tokens += ids
        self.action += [False] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.versions += [self.versions[-1] if self.versions else 0] * len(ids)  # not trained: any version serves
        self.text += text


def episodes_to_samples(episodes: list[Episode], pad_id: int, responses: list[str], reward_mode: str) -> Samples:
    """Left-pad prompts, right-pad the rest; rewards per `reward_mode` (sum / last turn reward on the last
    model token, or per_turn: each turn's reward on its own last model token)."""
    if reward_mode not in REWARD_MODES:
        raise ValueError(f"unknown agent reward mode {reward_mode!r}; valid: {', '.join(REWARD_MODES)}")
    sequences, attention, action_mask, rollout_lp = pad_rows(
        [e.prompt_ids for e in episodes], [e.tokens for e in episodes], [e.action for e in episodes],
        [e.log_probs for e in episodes], pad_id,
    )  # fmt: skip
    turn_rewards = None
    if reward_mode == "per_turn":
        turn_rewards = torch.zeros(action_mask.shape, dtype=torch.float32)
        for i, e in enumerate(episodes):
            for end, reward in zip(e.turn_ends, e.turn_rewards, strict=False):
                turn_rewards[i, end] += reward
    rewards = torch.tensor([_episode_reward(e, reward_mode) for e in episodes], dtype=torch.float32)
    scores = torch.tensor([e.turn_scores[-1] if e.turn_scores else 0.0 for e in episodes], dtype=torch.float32)
    keys = sorted({k for e in episodes for k in e.extra_logs})
    extra = {k: torch.tensor([sum(e.extra_logs.get(k, [0.0])) for e in episodes]) for k in keys}
    samples = Samples(
        sequences, attention, action_mask, rollout_lp, [e.prompt for e in episodes], responses,
        [e.label for e in episodes], torch.tensor([e.group_id for e in episodes]),
        torch.tensor([e.truncated for e in episodes]),
    )  # fmt: skip
    samples.rewards = RewardOutput(rewards, scores, extra)
    samples.turn_rewards = turn_rewards
    samples.step_meta = [e.step_meta for e in episodes]
    samples.step_rewards_ext = [e.step_rewards_ext for e in episodes]
    samples.routes = layout_routes(
        [len(e.prompt_ids) for e in episodes], [e.routes for e in episodes], sequences.size(1)
    )
    return samples


def _episode_reward(e: Episode, mode: str) -> float:
    if mode == "sum":
        return float(sum(e.turn_rewards))
    if mode == "last":
        return float(e.turn_rewards[-1]) if e.turn_rewards else 0.0
    return 0.0  # per_turn: all of it is in turn_rewards
