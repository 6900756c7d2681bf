"""The prompt stream of a run, with a position that a checkpoint can save and restore.

Episode e visits the prompts in the order of the e-th shuffle of `random.Random(seed)` (the same order the
trainer always used), keeping `len(prompts) // batch_size` full batches. The stream is those episodes one
after another; `position` counts the prompts taken from it. Top-ups (dynamic filtering) take from the same
stream, so a resumed run sees exactly the prompts an uninterrupted one would.
"""

from __future__ import annotations

import random


class PromptLoader:
    def __init__(self, prompts: list[dict], batch_size: int, num_episodes: int, seed: int):
        self.prompts, self.batch_size, self.num_episodes, self.seed = prompts, batch_size, num_episodes, seed
        self.per_episode = len(prompts) // batch_size * batch_size
        self.position = 0
        self._orders: list[list[int]] = []  # the shuffles of episodes 0.. computed so far

    @property
    def total(self) -> int:
        return self.per_episode * self.num_episodes

    def steps(self) -> int:
        """Full batches in the stream (the number of steps without top-ups)."""
        return self.total // self.batch_size

    def exhausted(self) -> bool:
        return self.position >= self.total

    def take(self, n: int) -> list[tuple[int, dict]]:
        """Up to the next `n` prompts of the stream as (dataset index, record) pairs."""
        out = []
        while len(out) < n and not self.exhausted():
            episode, offset = divmod(self.position, self.per_episode)
            index = self._order(episode)[offset]
            out.append((index, self.prompts[index]))
            self.position += 1
        return out

    def _order(self, episode: int) -> list[int]:
        if not self._orders:
            self._rng = random.Random(self.seed)
        while len(self._orders) <= episode:
            order = list(range(len(self.prompts)))
            self._rng.shuffle(order)
            self._orders.append(order)
        return self._orders[episode]

    def state_dict(self) -> dict:
        return {"position": self.position, "num_prompts": len(self.prompts), "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["num_prompts"] != len(self.prompts) or state["seed"] != self.seed:
            raise ValueError(
                f"the checkpoint was written for {state['num_prompts']} prompts and seed {state['seed']}; this run "
                f"has {len(self.prompts)} prompts and seed {self.seed}: resume with the same data and --seed"
            )
        self.position = state["position"]
