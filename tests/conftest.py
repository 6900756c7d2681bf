import os
import subprocess
from pathlib import Path

import pytest

# Import the package before any test module imports ray: it puts Ray's loopback settings in the
# environment, which Ray reads at import time (reinforce_pro/ray_env.py).
import reinforce_pro  # noqa: F401


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
