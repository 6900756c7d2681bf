"""When one of a run's actors is lost: what to call it, and whether the run goes on.

An actor is lost when its process dies under it (Ray's memory monitor, the kernel's OOM killer, a signal, a
crash): every call on it then raises one of LOST. An engine that lives but answers nothing (stopped,
deadlocked) is lost too, once a call on it outlasts --engine_timeout_s (rollout/engine_wait.py). The driver
(run/driver.py) restarts the run's actors from the newest checkpoint, within --max_failures; past that, or
where it cannot (engines the caller owns), the run stops with RunLost, whose message is one line: which actor,
why, what was saved and the command that resumes.
"""

from __future__ import annotations

import re

import ray
from ray import exceptions as rex

from reinforce_pro.rollout.engine_wait import ACTOR_LOST, KILL_REPORT, EngineHung, actor_hex_id, lost_actor_ids

# a call on a lost actor raises one of these (an actor's death, its worker's crash, Ray's memory monitor, an
# engine alive but answering nothing within --engine_timeout_s)
LOST = (*ACTOR_LOST, EngineHung)

ROLE_NAMES = {"policy": "policy rank", "reference": "reference rank", "critic": "critic rank",
              "engines": "vLLM engine", "reward_model": "reward model rank"}  # fmt: skip


class FailureBudget:
    """--max_failures: how many lost actors a run may recover from, whole-run restarts and engine restarts alike."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def left(self) -> bool:
        return self.used < self.limit

    def spend(self) -> bool:
        """One recovery, if the budget has one left."""
        if not self.left():
            return False
        self.used += 1
        return True


class RunLost(Exception):
    """The run stopped because an actor was lost and it could not (or may no longer) recover; one line."""


def actor_of(error: BaseException, roles: dict[str, list]) -> str:
    """The lost actor's name in the run's words ("vLLM engine 0", "policy rank 1"), from the actor id Ray's error
    carries or its memory monitor's report selected; its class and process id where the id is not one of `roles`
    (an actor of roles() per role)."""
    ids = lost_actor_ids(error)
    for role, actors in roles.items():
        for rank, actor in enumerate(actors):
            if actor_hex_id(actor) in ids:
                return f"{ROLE_NAMES.get(role, role)} {rank}"
    text = str(error)
    selected = re.search(KILL_REPORT, text)  # a memory-monitor report
    picked = selected[0] if selected else ""
    cls = re.search(r"class_name: (\S+)", text) or re.search(r"task name=(\w+)", picked)
    pid = re.search(r"\bpid: (\d+)", text) or re.search(r"\bpid=(\d+)", picked)
    if cls:
        return f"actor {cls[1]}" + (f" (pid {pid[1]})" if pid else "")
    return "a worker"


def cause(error: BaseException) -> str:
    """Why Ray says the actor died, in a few words: the memory monitor (with the node's use and largest users
    when Ray lists them), or the process dying under it (a signal, the kernel's OOM killer, a crash)."""
    text = str(error)
    if isinstance(error, rex.OutOfMemoryError) or "running low on memory" in text or "memory monitor" in text:
        used = re.search(r"Memory on the node .{0,300}? was ([\d.]+\s*GB)(?: used)?\s*/\s*([\d.]+\s*GB)", text, re.S)
        top = _top_users(text)
        return (
            "killed by Ray's memory monitor"
            + (f" (node memory {used[1]} / {used[2]})" if used else "")
            + (f"; largest users: {top}" if top else "")
        )
    if isinstance(error, rex.NodeDiedError):
        return "its node died"
    if "init" in text and getattr(error, "actor_init_failed", False):
        return "it failed to start"
    return "its process died (a signal, the kernel's OOM killer or a crash)"


def _top_users(text: str, count: int = 3) -> str:
    """The first `count` rows of the memory table Ray appends to a memory-monitor kill ("PID MEM(GB) COMMAND")."""
    head = text.find("MEM(GB)")
    if head < 0:
        return ""
    rows = []
    for line in text[head:].splitlines()[1:]:
        parts = line.split(None, 2)
        if len(parts) < 3 or not parts[0].isdigit():
            break
        rows.append(f"pid {parts[0]} {parts[1]} GB ({parts[2][:40]})")
        if len(rows) == count:
            break
    return ", ".join(rows)


def dead_actor(roles: dict[str, list], timeout_s: float = 10.0) -> BaseException | None:
    """The error of the first of the run's actors whose process is gone (the error a call on it raises), None when
    every actor answers or is only busy (no answer within `timeout_s` is not death). For a call that failed with
    an error of its own: the survivors of a collective whose peer died report the broken connection ("connection
    closed by peer") as their error, possibly before Ray reports the death itself."""
    probes = [actor.__ray_ready__.remote() for actors in roles.values() for actor in actors]
    ray.wait(probes, num_returns=len(probes), timeout=timeout_s)
    for probe in probes:
        try:
            ray.get(probe, timeout=0)
        except LOST as e:
            return e
        except rex.GetTimeoutError:
            continue
    return None


def first_line(error: BaseException) -> str:
    """The first line of what an actor's own error says (a RayTaskError's cause, not Ray's traceback of it)."""
    text = str(getattr(error, "cause", None) or error).strip()
    return (text.splitlines() or [type(error).__name__])[0][:200]


def describe(error: BaseException, roles: dict[str, list], step: int) -> str:
    """One line: which actor was lost, at which step, and why."""
    if isinstance(error, EngineHung):
        return (f"vLLM engine {error.index} hung at step {step + 1}: no answer to a {error.call} call in "
                f"{error.seconds:g} s (--engine_timeout_s)")  # fmt: skip
    return f"{actor_of(error, roles)} was lost at step {step + 1}: {cause(error)}"
