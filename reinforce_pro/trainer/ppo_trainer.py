"""The RL loop: generate -> make_experience -> train -> weight_sync, one named, timed phase each."""

from __future__ import annotations

import math
import random
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass

import ray
import torch
from tqdm import tqdm

from reinforce_pro.experience import Experience, split_experience
from reinforce_pro.trainer.experience_maker import ExperienceMaker
from reinforce_pro.trainer.logger import MetricsLogger


@dataclass
class LoopConfig:
    num_episodes: int = 1
    rollout_batch_size: int = 8  # prompts per step
    train_batch_size: int = 128  # samples per optimizer step, over all data-parallel ranks
    micro_train_batch_size: int = 4  # samples per forward on one rank
    max_epochs: int = 1  # passes over each rollout batch
    freezing_actor_steps: int = -1  # train only the critic for the first N steps
    logging_steps: int = 1
    seed: int = 42
    sync_dtype: str = "float32"  # the engines' dtype: weights are sent in it
    rollout_staleness: int = 0  # engines sample with the policy of this many steps ago


@contextmanager
def timed(timings: dict[str, float], phase: str):
    start = time.perf_counter()
    yield
    timings[f"time/{phase}"] = time.perf_counter() - start


class PPOTrainer:
    def __init__(
        self, maker: ExperienceMaker, policy, critic, engines, prompts, logger: MetricsLogger, cfg: LoopConfig
    ):
        self.maker, self.policy, self.critic, self.engines = maker, policy, critic, engines
        self.prompts, self.logger, self.cfg = prompts, logger, cfg
        self.history: list[dict[str, float]] = []
        # Weight versions in the object store, newest last; the engines get the one `rollout_staleness` old.
        self.versions: deque = deque(maxlen=cfg.rollout_staleness + 1)

    def steps_per_episode(self) -> int:
        return len(self.prompts) // self.cfg.rollout_batch_size

    def batches(self):
        rng = random.Random(self.cfg.seed)
        for _ in range(self.cfg.num_episodes):
            order = list(range(len(self.prompts)))
            rng.shuffle(order)
            size = self.cfg.rollout_batch_size
            for start in range(0, self.steps_per_episode() * size, size):
                yield [self.prompts[i] for i in order[start : start + size]]

    def fit(self) -> list[dict[str, float]]:
        total = self.steps_per_episode() * self.cfg.num_episodes
        self.sync_weights()  # engines start from the policy's weights even if they served another run before
        bar = tqdm(total=total, desc="RL steps", dynamic_ncols=True)
        for step, batch in enumerate(self.batches(), start=1):
            timings: dict[str, float] = {}
            with timed(timings, "step"):
                with timed(timings, "generate"):
                    samples = self.maker.generate(batch)
                with timed(timings, "make_experience"):
                    experience, metrics = self.maker.make_experience(samples)
                with timed(timings, "train"):
                    metrics.update(self.train(experience, step))
                with timed(timings, "weight_sync"):
                    self.sync_weights()
            metrics.update(timings)
            metrics["perf/tokens_per_s"] = float(samples.action_mask.sum()) / timings["time/step"]
            self.record(step, metrics)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['rollout/reward_mean']:.3f}", step_s=f"{timings['time/step']:.1f}")
        bar.close()
        return self.history

    def record(self, step: int, metrics: dict[str, float]) -> None:
        self.maker.kl_ctl.update(metrics.get("kl/ref_kl_mean", 0.0), int(metrics["rollout/num_samples"]))
        self.history.append({"step": step, **metrics})
        if step % self.cfg.logging_steps == 0 or step == 1:
            self.logger.log(step, metrics)

    def train(self, exp: Experience, step: int) -> dict[str, float]:
        """`max_epochs` passes over the rollout batch in shuffled mini-batches of about train_batch_size
        (self-play batches vary in size: they are cut into ceil(rows / train_batch_size) equal parts)."""
        gen = torch.Generator().manual_seed(self.cfg.seed * 100_003 + step)
        train_policy = step > self.cfg.freezing_actor_steps
        history = []
        for _ in range(self.cfg.max_epochs):
            order = torch.randperm(len(exp), generator=gen)
            for rows in torch.tensor_split(order, math.ceil(len(exp) / self.cfg.train_batch_size)):
                history.append(self._train_minibatch(exp.select(rows), train_policy))
        return {k: sum(h[k] for h in history) / len(history) for k in history[0]}

    def _train_minibatch(self, mini: Experience, train_policy: bool) -> dict[str, float]:
        tokens = float(mini.action_mask.sum())
        seqs = float((mini.action_mask.sum(-1) > 0).sum())
        groups = ([self.policy] if train_policy else []) + ([self.critic] if self.critic else [])
        refs = []
        for group in groups:
            shards = torch.tensor_split(torch.arange(len(mini)), len(group))
            # every rank runs the same number of micro-batches: ZeRO's gradient collectives must pair up
            num_micro = math.ceil(len(shards[0]) / self.cfg.micro_train_batch_size)
            refs.append(
                [
                    actor.train_minibatch.remote(split_experience(mini.select(idx), num_micro), tokens, seqs)
                    for actor, idx in zip(group, shards, strict=True)
                ]
            )
        stats: dict[str, float] = {}
        for group_refs in refs:
            stats.update(ray.get(group_refs)[0])  # rank 0 speaks for the group (DP ranks hold the same model)
        return stats

    def sync_weights(self) -> None:
        """Push policy weights to every rollout engine (safetensors bytes through the object store): the
        current ones, or with rollout_staleness K those of K steps ago (the oldest kept until K exist)."""
        refs = [p.state_dict_bytes.remote(self.cfg.sync_dtype) for p in self.policy]
        ray.get(refs[1:])  # the other ranks take part in gathering ZeRO-3 shards
        self.versions.append(refs[0])
        ray.get([engine.update_weights.remote(self.versions[0]) for engine in self.engines])
