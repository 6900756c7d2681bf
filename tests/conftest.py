import os
import subprocess
import time
from pathlib import Path

import pytest

# Import the package before any test module imports ray: it puts Ray's loopback settings in the
# environment, which Ray reads at import time (reinforce_pro/ray_env.py).
import reinforce_pro  # noqa: F401

# The suite's engines load many throwaway model directories (tmp_path), and vLLM's ahead-of-time compile cache,
# which a run uses for a model directory the user names, is keyed by the path: each would compile from scratch
# (~22 s for the tiny model against ~4 s from Inductor's graph cache, which any directory of the architecture
# hits). Engines and Ray workers inherit this; tests/test_engine_compile_cache.py covers the AOT cache.
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")

SLOW_TEST_S = 60.0  # a test slower than this gets its own line as it ends (CI's log is otherwise dots)
_SESSION_START = time.monotonic()
_CONFIG = None


def pytest_configure(config):
    global _CONFIG
    _CONFIG = config


def pytest_runtest_logreport(report):
    """Say where the time goes while the suite runs, not only at its end (--durations): a CI run stopped by
    its time limit then shows the last slow tests and when each ended."""
    if report.duration > SLOW_TEST_S:  # setup counts too: the shared Ray cluster and engines start there
        minutes, seconds = divmod(int(time.monotonic() - _SESSION_START), 60)
        phase = "" if report.when == "call" else f" ({report.when})"
        line = f"[slow test] {report.nodeid}{phase}: {report.duration:.0f} s (session at {minutes}m{seconds:02d}s)"
        terminal = _CONFIG.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.ensure_newline()
            terminal.write_line(line)


@pytest.fixture
def recipe_argv(tmp_path):
    """`recipe_argv(name, **env)`: the argv (after `-m <module>`) that examples/scripts/<name> passes to
    python, recorded by a stand-in python instead of run; OUT defaults to tmp_path/run, `env` adds to the
    script's environment (STEPS, RESUME, ...)."""
    recorder = tmp_path / "python"
    recorder.write_text('#!/bin/sh\nprintf "%s\\0" "$@" > "$ARGV_OUT"\n')
    recorder.chmod(0o755)
    scripts = Path(__file__).resolve().parents[1] / "examples" / "scripts"

    def record(name: str, **env: str) -> list[str]:
        out = tmp_path / f"{name}.argv"
        env = {**os.environ, "PYTHON": str(recorder), "ARGV_OUT": str(out), "OUT": str(tmp_path / "run"), **env}
        subprocess.run(["bash", str(scripts / name)], env=env, check=True, timeout=60)
        argv = out.read_bytes().decode().split("\0")[:-1]
        assert argv[:2] == ["-m", "reinforce_pro.cli.train_ppo_ray"], argv[:2]
        return argv[2:]

    return record
