"""Losing a rollout engine without losing a step: the lost engine (dead, or hung past --engine_timeout_s) is
started again in its place, given the weights the other engines hold, and the call that lost it runs again.

The driver supplies `restart(index, error, step)`, which spends one of the run's --max_failures, kills what is
left of the old engine and returns a new one (run/driver.py); it raises `error` again when it may not (the
budget is spent), and the driver then restarts the whole run from its newest checkpoint or stops. The engines
list is shared with the sampler, the weight sync and the agent endpoints, so the new engine is replaced in it in
place. A batch whose sampling lost an engine is sampled again from the same prompts (the prompt stream and the
rollout source go back to where they were); a weight sync is pushed again.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

from reinforce_pro.rollout.engine_wait import ACTOR_LOST, EngineHung, lost_engine

Restart = Callable[[int, BaseException, int], object]  # (engine index, the error, completed steps) -> new engine


class EngineRecovery:
    def __init__(self, engines: list, weight_sync, restart: Restart | None):
        """`restart` None: engines are not restarted here (the caller's own engines, or a weight sync that cannot
        give a new engine the weights the others hold); a lost one ends the call as before."""
        self.engines, self.weight_sync = engines, weight_sync
        self.restart = restart if getattr(weight_sync, "restores_engines", False) else None
        self.restarts = 0  # engines started again during this fit (logged as faults/engine_restarts)

    def run(self, call: Callable, step: int, before_again: Callable[[], None] = lambda: None, hold=None):
        """call(), and again after each engine it loses is replaced; `before_again` puts back what the failed
        call consumed (the prompt stream's position). `hold`: a lock held from the loss until the call has run
        again (a weight sync holds the engines' gate, so that nothing samples with a half-replaced set)."""
        try:
            return call()
        except (*ACTOR_LOST, EngineHung) as error:
            with hold or nullcontext():
                self.replace(error, step)
                before_again()
                return self.run(call, step, before_again)

    def replace(self, error: BaseException, step: int) -> None:
        """Engine `error` names started again in place with the others' weights, or `error` raised again."""
        index = lost_engine(error, self.engines)
        if index is None or self.restart is None:
            raise error
        self.engines[index] = self.restart(index, error, step)
        self.weight_sync.restore(index)
        self.restarts += 1
