"""The Absolute-Zero rollout source: one batch of seed prompts -> proposer and solver samples with their
rewards, as one `Samples` batch that the ordinary ExperienceBuilder turns into one joint update.

Rows are ordered solver groups first (rollout_n consecutive rows per kept question), then proposer rows;
`advantage_segments` tells the builder to compute each role's advantages on its own (docs/selfplay.md).
"""

from __future__ import annotations

import random

import torch

from reinforce_pro.experience import Samples
from reinforce_pro.rewards.loader import RewardOutput
from reinforce_pro.rollout.sampler import Sampler, sampling_params
from reinforce_pro.selfplay.controller import Rollout, SelfPlayConfig, SelfPlayController
from reinforce_pro.selfplay.tasks import SelfPlayTask, role_sampling

JUDGE_MAX_TOKENS = 8


class SelfPlaySource:
    def __init__(self, sampler: Sampler, task: SelfPlayTask, selfplay: SelfPlayConfig, seed: int, judge_engines=None):
        """judge_engines: engines that serve the task's `llm` scorers (greedy); None uses the rollout engines,
        i.e. the current policy judges."""
        self.sampler, self.task, self.judge_engines = sampler, task, judge_engines
        self.controller = SelfPlayController(task, selfplay, self.generate_texts, self.judge)
        self.rng = random.Random(seed)  # which question of each group is sampled: part of the resume state

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), **self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]  # lists after a JSON round trip
        self.rng.setstate((version, tuple(internal), gauss))
        self.controller.load_state_dict(state)

    def use_partial(self, partial) -> None:
        raise ValueError("--partial_rollout applies to prompt rollouts and agent episodes, not to self-play")

    def generate_texts(self, prompts: list[str], sampling: dict | None = None, engines=None) -> list[Rollout]:
        """Sample one response per prompt text; Rollout.generation keeps (prompt ids, Generation). `sampling`
        overrides the run's sampling parameters key by key (the task's per-role budgets, the judge's);
        --max_new_tokens stays the ceiling, so a response always fits --max_len."""
        if sampling:
            sampling = role_sampling(sampling_params(self.sampler.cfg), sampling)
        ids, generations, texts = self.sampler.sample_texts(prompts, sampling, engines)
        return [Rollout(p, t, (i, g)) for p, t, i, g in zip(prompts, texts, ids, generations, strict=True)]

    def judge(self, prompts: list[str]) -> list[str]:
        """Greedy completions of the judge model, for tasks whose scorers are `llm`."""
        sampling = {"temperature": 0.0, "max_tokens": JUDGE_MAX_TOKENS, "skip_special_tokens": True}
        return [r.text for r in self.generate_texts(prompts, sampling, self.judge_engines)]

    def generate(self, batch: list[dict]) -> Samples:
        """`batch`: seed records. Runs the whole self-play step (with re-proposals) and returns its
        training rows, already scored."""
        result = self.controller.step(batch, self.rng)
        rows = result.samples
        prompt_ids = [s.rollout.generation[0] for s in rows]
        generations = [s.rollout.generation[1] for s in rows]
        index = torch.zeros(len(rows), dtype=torch.long)
        for k, (start, end, _) in enumerate(result.segments):
            index[start:end] = k
        samples = self.sampler.to_samples(
            prompt_ids, generations, [s.rollout.prompt for s in rows], [None] * len(rows), index
        )
        is_proposer = torch.tensor([float(s.role == "proposer") for s in rows])
        samples.rewards = RewardOutput(
            rewards=torch.tensor([s.reward for s in rows], dtype=torch.float32),
            scores=torch.tensor([s.score for s in rows], dtype=torch.float32),
            extra_logs={"proposer_frac": is_proposer},
        )
        samples.advantage_segments = result.segments
        samples.metrics = result.metrics
        return samples
