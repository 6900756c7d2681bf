"""Waiting for the rollout engines with a limit, so that a hung engine ends a wait instead of the run; and which
engine an error reports lost.

An engine hangs when its process is alive but answers nothing: stopped (SIGSTOP, a debugger), deadlocked, or
stuck on its device. Ray sees a live actor, so a plain `ray.get` on its call would wait forever. Every call the
trainer waits on (sampling, weight syncs) goes through `wait_for_engines` with --engine_timeout_s; an engine
that has not answered by then raises EngineHung, which is treated like a lost actor: the engine is replaced in
place (trainer/engine_recovery.py) or, where it cannot be, the run's actors start again from the newest
checkpoint (run/driver.py).
"""

from __future__ import annotations

import re

import ray
from ray import exceptions as rex

# a call on a lost actor raises one of these (an actor's death, its worker's crash, Ray's memory monitor)
ACTOR_LOST = (rex.RayActorError, rex.WorkerCrashedError, rex.OutOfMemoryError, rex.NodeDiedError)


class EngineHung(RuntimeError):
    """An engine that did not answer `call` within `seconds`; `index`: its place among the engines it was
    called with, `actor_id`: its Ray actor id (hex), which tells it from another list's engine."""

    def __init__(self, index: int, call: str, seconds: float, actor_id: str | None = None):
        self.index, self.call, self.seconds, self.actor_id = index, call, seconds, actor_id
        super().__init__(f"vLLM engine {index} answered no {call} call in {seconds:g} s (--engine_timeout_s)")


def wait_for_engines(refs: list, engine_of_ref: list, call: str, timeout_s: float) -> list:
    """ray.get(refs) once every ref is ready; `engine_of_ref[i]`: (index, actor handle) of the engine refs[i]
    waits on (None: a ref on another actor, e.g. the policy's side of a broadcast). With `timeout_s` > 0,
    raises EngineHung naming the first engine with a ref still pending after `timeout_s` seconds; an actor that
    died meanwhile makes ray.get raise its own error (ACTOR_LOST), before the error its loss caused in another
    member of the call (a broadcast's sender: "connection closed by peer"). 0 waits as long as it takes."""
    if timeout_s > 0 and refs:
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        hung = [engine_of_ref[refs.index(ref)] for ref in pending]
        hung = sorted((h for h in hung if h is not None), key=lambda h: h[0])
        if hung:
            index, handle = hung[0]
            raise EngineHung(index, call, timeout_s, actor_hex_id(handle))
    ray.get([ref for ref, owner in zip(refs, engine_of_ref, strict=True) if owner is not None])
    return ray.get(refs)


def actor_hex_id(actor) -> str | None:
    """The Ray actor id (hex) of a handle, the form Ray's errors carry; None for anything else."""
    handle = getattr(actor, "_actor_id", None)
    return handle.hex() if handle is not None else None


# a line of Ray's memory-monitor report naming an actor it killed (its id, then its task name and pid)
KILL_REPORT = r"Selected to kill: \(Actor\(([0-9a-f]+)\):[^\n]*"


def lost_actor_ids(error: BaseException) -> list[str]:
    """The Ray actor ids (hex) `error` reports lost: the one it carries, or, for a kill by Ray's memory monitor
    reported on a call it carries none for, the actors its report selected ("Selected to kill: (Actor(<id>)")."""
    if not isinstance(error, (*ACTOR_LOST, EngineHung)):
        return []
    actor_id = getattr(error, "actor_id", None)
    return [actor_id] if actor_id else re.findall(KILL_REPORT, str(error))


def lost_engine(error: BaseException, engines: list) -> int | None:
    """The index in `engines` of the engine `error` reports lost (hung, or dead by the actor id Ray's error
    carries or its memory monitor selected), or None when it is about another actor or none."""
    if isinstance(error, EngineHung) and error.actor_id is None:
        return error.index if error.index < len(engines) else None
    ids = lost_actor_ids(error)
    return next((i for i, engine in enumerate(engines) if actor_hex_id(engine) in ids), None)
