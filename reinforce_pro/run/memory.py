"""How much memory the run holds and how close the node is to Ray's memory monitor: `memory/*` metrics every
step and one line at start.

Ray's memory monitor kills a worker once the node's used memory passes RAY_memory_usage_threshold (0.95 of
the total by default); on a machine shared with other work that is how a long run ends. Each actor's process
id comes from placement.json (run/actors.py: record_placement); a process's memory is its resident set plus its
children's (a vLLM engine's model lives in its engine-core child). Actors on other nodes are not read.
"""

from __future__ import annotations

import os

import psutil

GB = 1024**3
DEFAULT_THRESHOLD = 0.95  # Ray's default memory_usage_threshold


def kill_threshold() -> float:
    """The used fraction of the node's memory above which Ray's monitor kills workers."""
    try:
        return float(os.environ.get("RAY_memory_usage_threshold", DEFAULT_THRESHOLD))
    except ValueError:
        return DEFAULT_THRESHOLD


def tree_rss(pid: int, children: bool = True) -> float:
    """Resident bytes of process `pid` and (with `children`) its descendants; 0 for a process that is gone. The
    driver is read alone: a local Ray cluster's raylet, and through it every worker, descends from it."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *(proc.children(recursive=True) if children else [])]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


class MemoryWatch:
    """The run's processes on this node (the driver and every actor placement.json places here, by role and rank)
    and the node's memory against Ray's kill threshold."""

    def __init__(self, placement: dict[str, list[dict]], here: str | None = None):
        self.here = here or _node_ip()
        self.follow(placement)
        self.threshold = kill_threshold()

    def follow(self, placement: dict[str, list[dict]]) -> None:
        """Read the processes `placement` places on this node (again after an actor was replaced)."""
        self.processes = {"driver": os.getpid()}
        for role, actors in placement.items():
            for rank, where in enumerate(actors):
                if where.get("pid") and where.get("ip") in (self.here, "127.0.0.1"):
                    self.processes[f"{role}{rank}"] = where["pid"]

    def metrics(self) -> dict[str, float]:
        """memory/<process>_rss_gb per process, memory/run_rss_gb over them, the node's used fraction and the
        headroom (GB) before Ray's monitor acts."""
        node = psutil.virtual_memory()
        used = node.total - node.available
        out = {f"memory/{name}_rss_gb": tree_rss(pid, name != "driver") / GB for name, pid in self.processes.items()}
        out["memory/run_rss_gb"] = sum(out.values())
        out["memory/node_used_frac"] = used / node.total
        out["memory/headroom_gb"] = (self.threshold * node.total - used) / GB
        return out

    def startup_line(self) -> str:
        """One line: what the node holds, where Ray's monitor acts, what the run holds; flagged when the headroom
        is smaller than what the run's processes hold already (a run's memory grows after its first steps)."""
        m, total = self.metrics(), psutil.virtual_memory().total / GB
        line = (f"[memory] node {m['memory/node_used_frac'] * total:.1f} of {total:.1f} GB in use; Ray's memory "
                f"monitor stops workers above {self.threshold:.0%} ({m['memory/headroom_gb']:.1f} GB from here); "
                f"this run's processes hold {m['memory/run_rss_gb']:.1f} GB")  # fmt: skip
        if m["memory/headroom_gb"] < m["memory/run_rss_gb"]:
            line += ". Tight: another process's growth or the run's own can get a worker killed (memory/* per step)"
        return line


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
