"""Run model-written Python in a separate, kernel-confined process and get back repr(entry(input)) or a reason.

Each run is a fresh `python -I -S` process (`_sandbox_child.py`) in a new session, with an empty environment,
a temporary working directory, stdout and stderr on /dev/null, and one extra pipe, the result fd, on which
the harness writes one JSON line. Before the code runs, the child installs the kernel layers this machine
has (Landlock: read-only access to the standard library and nothing else; seccomp: no processes, threads,
exec, sockets, signals to others, ptrace, writes or file-system changes) plus rlimits; see the child's
docstring for the full list. The parent:
- knows which layers the machine has (`isolation()`, probed once) and demands all of them on every run: a run
  that cannot install one is a failure, never a silently weaker sandbox; with no kernel layer at all, nothing
  runs (`require_isolation()` says what to install);
- reads the result fd with a cap (RESULT_CAP_BYTES) and a wall clock, never more than the cap;
- accepts a success only if exactly one well-formed line arrived and the process exited 0; the harness exits
  1 after any failure, so a program that raises cannot come back as a success by writing on the channel or by
  rewriting the harness's Python state;
- kills the child's whole session when done (the child cannot fork, so there is nothing else to chase).

What the kernel cannot tell apart: a program that takes over its own interpreter can write a success line and
end its own process, choosing its output; it gains nothing a program that returns that value would not have,
and touches nothing outside (no file, process, socket or secret). For self-play it makes a question whose
answer the code does not visibly compute: unsolvable, so worth nothing to its proposer.

A determinism check runs the code twice, with different hash seeds. Nothing here raises on bad code: every
failure is a `SandboxResult(ok=False, reason=...)`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CHILD = Path(__file__).with_name("_sandbox_child.py")
RESULT_CAP_BYTES = 64 * 1024
KERNEL_LAYERS = ("landlock", "seccomp")
INSTALL_HINT = (
    "install the kernel sandbox bindings (pip install pyseccomp==0.1.2 landlock==1.0.0.dev5, and the system "
    "library libseccomp2) on Linux >= 5.13"
)


class SandboxUnavailable(RuntimeError):
    """No kernel isolation layer works on this machine: model-written code must not run here."""


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


@dataclass(frozen=True)
class Isolation:
    """The layers a sandboxed run installs on this machine, and why the others are missing."""

    layers: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def kernel(self) -> tuple[str, ...]:
        return tuple(layer for layer in self.layers if layer.startswith(KERNEL_LAYERS))

    def describe(self) -> str:
        missing = f"; missing: {'; '.join(self.problems)}" if self.problems else ""
        return f"sandbox layers: {', '.join(self.layers) or 'none'}{missing}"


@functools.cache
def isolation() -> Isolation:
    """Probe once per process: run a trivial program with no layer required and see which ones it installed."""
    frame, status, _ = _spawn("def f(x):\n    return x", "f", "1", SandboxLimits(), hash_seed=0, require=())
    if frame is None or status != 0:
        return Isolation((), (f"the probe run failed (status {status})",))
    return Isolation(tuple(frame.get("layers", ())), tuple(frame.get("problems", ())))


def require_isolation() -> Isolation:
    """The layers in force, or SandboxUnavailable (one line) when none of the kernel layers is."""
    found = isolation()
    if not found.kernel:
        raise SandboxUnavailable(f"no kernel sandbox layer works here ({found.describe()}): {INSTALL_HINT}")
    return found


def run_once(code: str, entry: str, argument: str, limits: SandboxLimits, hash_seed: int = 0) -> SandboxResult:
    """One run of `entry(literal_eval(argument))` after executing `code`."""
    if len(code) > limits.max_code_chars:
        return SandboxResult(False, reason=f"code is {len(code)} characters, over {limits.max_code_chars}")
    try:
        required = require_isolation().kernel
    except SandboxUnavailable as e:
        return SandboxResult(False, reason=str(e))
    frame, status, why = _spawn(code, entry, argument, limits, hash_seed, required)
    if frame is None:
        return SandboxResult(False, reason=why)
    if bool(frame.get("ok")) != (status == 0):
        return SandboxResult(False, reason="the verdict disagrees with the exit status: the code forged it")
    if frame.get("ok"):
        return SandboxResult(True, str(frame.get("output", "")))
    return SandboxResult(False, reason=str(frame.get("reason", "failed")))


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


def _spawn(code, entry, argument, limits, hash_seed, require) -> tuple[dict | None, int | None, str]:
    """Run the child; return (the one verdict line or None, exit status, why there is no verdict)."""
    read_fd, write_fd = os.pipe()
    request = {"code": code, "entry": entry, "input": argument, "cpu_s": limits.cpu_s,
               "memory_mb": limits.memory_mb, "max_output_chars": limits.max_output_chars,
               "result_fd": write_fd, "require": list(require), "readable": _readable_dirs(),
               "library_paths": _binding_paths()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="reinforce_pro_sandbox_") as workdir:
        env = {"PYTHONHASHSEED": str(hash_seed), "HOME": workdir, "TMPDIR": workdir, "PATH": "/nonexistent"}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(CHILD)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(write_fd,), cwd=workdir, env=env, start_new_session=True,
            )  # fmt: skip
        finally:
            os.close(write_fd)  # the child holds the only write end: EOF when it is gone
        try:
            try:
                proc.stdin.write(json.dumps(request).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            data, why = _read_capped(read_fd, limits.wall_s)
            if why is None:
                try:
                    proc.wait(timeout=max(0.1, limits.wall_s))
                except subprocess.TimeoutExpired:
                    why = _over_wall_clock(limits.wall_s)
        finally:
            os.close(read_fd)
            _kill_session(proc)
    if why is not None:
        return None, proc.returncode, why
    text = data.decode(errors="replace")
    if not text:
        return None, proc.returncode, _died(proc.returncode)
    if text.count("\n") > 1:
        return None, proc.returncode, "the result channel held more than one verdict: the code wrote to it"
    if not text.endswith("\n"):  # cut off mid-line: killed while writing, or the code wrote a partial line
        return None, proc.returncode, f"the result channel held no complete verdict ({_died(proc.returncode)})"
    try:
        frame = json.loads(text)
    except json.JSONDecodeError:
        frame = None
    if not isinstance(frame, dict) or "ok" not in frame:
        return None, proc.returncode, "the result channel held no well-formed verdict"
    return frame, proc.returncode, ""


def _read_capped(fd: int, wall_s: float) -> tuple[bytes, str | None]:
    """Everything written on `fd` until EOF, or a reason: past `wall_s`, or over RESULT_CAP_BYTES."""
    chunks, size, deadline = [], 0, time.monotonic() + wall_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"", _over_wall_clock(wall_s)
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, RESULT_CAP_BYTES + 1 - size)
        if not chunk:
            return b"".join(chunks), None
        chunks.append(chunk)
        size += len(chunk)
        if size > RESULT_CAP_BYTES:
            return b"", f"the result channel exceeded {RESULT_CAP_BYTES // 1024} KiB"


def _over_wall_clock(wall_s: float) -> str:
    return f"wall-clock limit of {wall_s:g} s exceeded"


def _died(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        return {"SIGXCPU": "CPU time limit exceeded", "SIGKILL": "killed (CPU or memory limit)"}.get(name, name)
    return f"the sandbox process exited with status {returncode} and no verdict"


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session: this is its group only
    except ProcessLookupError:
        pass
    proc.wait()


@functools.cache
def _readable_dirs() -> list[str]:
    """The standard library (pure and compiled parts): lazy imports of allowed modules read from it."""
    paths = sysconfig.get_paths()
    return sorted({paths["stdlib"], paths["platstdlib"]})


@functools.cache
def _binding_paths() -> list[str]:
    """Where the child finds pyseccomp and landlock (it runs with -I -S: no site-packages of its own)."""
    found = []
    for name in ("pyseccomp", "landlock"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            origin = Path(spec.origin)
            found.append(str(origin.parent.parent if origin.name == "__init__.py" else origin.parent))
    return sorted(set(found))
