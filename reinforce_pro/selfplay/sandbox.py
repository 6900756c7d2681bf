"""Run model-written Python in a separate, limited process and get back repr(entry(input)) or a reason.

Each run is a fresh `python -I -S` process (isolated mode: no site-packages, no PYTHON* variables, no
user directory) in a new session, with an empty environment and a temporary working directory that is
deleted afterwards. The child (`_sandbox_child.py`) sets CPU / memory / file-size / process limits and
refuses dangerous imports, builtins and operations; the parent enforces the wall-clock limit by killing
the child's whole process group. A determinism check runs the code twice, with different hash seeds.

Nothing here raises on bad code: every failure is a `SandboxResult(ok=False, reason=...)`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHILD = Path(__file__).with_name("_sandbox_child.py")


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 5.0
    cpu_s: int = 2
    memory_mb: int = 512
    max_code_chars: int = 4000
    max_output_chars: int = 1000


@dataclass(frozen=True)
class SandboxResult:
    ok: bool
    output: str = ""  # repr of the entry function's return value
    reason: str = ""  # why it failed, for logs and for the invalid-question verdict


def run_once(code: str, entry: str, argument: str, limits: SandboxLimits, hash_seed: int = 0) -> SandboxResult:
    """One run of `entry(literal_eval(argument))` after executing `code`."""
    if len(code) > limits.max_code_chars:
        return SandboxResult(False, reason=f"code is {len(code)} characters, over {limits.max_code_chars}")
    request = {"code": code, "entry": entry, "input": argument, "cpu_s": limits.cpu_s,
               "memory_mb": limits.memory_mb, "max_output_chars": limits.max_output_chars}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="reinforce_pro_sandbox_") as workdir:
        env = {"PYTHONHASHSEED": str(hash_seed), "HOME": workdir, "TMPDIR": workdir, "PATH": "/nonexistent"}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(CHILD)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=workdir, env=env, start_new_session=True,
        )  # fmt: skip
        try:
            stdout, _ = proc.communicate(json.dumps(request).encode(), timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return SandboxResult(False, reason=f"wall-clock limit of {limits.wall_s:g} s exceeded")
        finally:
            _kill_group(proc)  # anything the code left running in its session
    return _parse(proc.returncode, stdout)


def run_deterministic(code: str, entry: str, argument: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run twice (hash seeds 0 and 1); the output counts only if both runs succeed and agree."""
    limits = limits or SandboxLimits()
    first = run_once(code, entry, argument, limits, hash_seed=0)
    if not first.ok:
        return first
    second = run_once(code, entry, argument, limits, hash_seed=1)
    if not second.ok:
        return second
    if first.output != second.output:
        return SandboxResult(False, reason="non-deterministic: two runs gave different outputs")
    return first


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session: this is its group only
    except ProcessLookupError:
        pass
    proc.wait()


def _parse(returncode: int, stdout: bytes) -> SandboxResult:
    lines = stdout.decode(errors="replace").strip().splitlines()
    if lines:
        try:
            reply = json.loads(lines[-1])
        except json.JSONDecodeError:
            reply = None
        if isinstance(reply, dict) and "ok" in reply:
            return SandboxResult(bool(reply["ok"]), reply.get("output", ""), reply.get("reason", ""))
    if returncode < 0:
        name = signal.Signals(-returncode).name
        why = {"SIGXCPU": "CPU time limit exceeded", "SIGKILL": "killed (CPU or memory limit)"}.get(name, name)
        return SandboxResult(False, reason=why)
    return SandboxResult(False, reason=f"the sandbox process exited with status {returncode} and no verdict")
