"""A model worker's start on CPU survives what a killed process leaves behind (workers/base.load_shm_op)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reinforce_pro.workers.base import SHM_OP, load_shm_op


def test_a_dead_loaders_lock_is_removed_and_the_load_holds_the_kernel_lock(tmp_path):
    stale = tmp_path / SHM_OP / "lock"
    stale.parent.mkdir()
    stale.touch()
    seen = {}

    def load():
        seen["stale lock"] = stale.exists()
        with open(tmp_path / "reinforce_pro.lock", "w") as other:  # another process's try, as it would be
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen["guard held"] = False
            except BlockingIOError:
                seen["guard held"] = True

    load_shm_op(tmp_path, load)
    assert seen == {"stale lock": False, "guard held": True}
    with open(tmp_path / "reinforce_pro.lock", "w") as after:  # released once the load is done
        fcntl.flock(after, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.e2e
def test_deepspeed_starts_despite_a_lock_left_by_a_killed_process(tmp_path):
    """The hang this guards against, for real: a `lock` file in the op's build directory (what a process
    killed during its load leaves; a fresh-clone CI run sat in FileBaton.wait until it was killed at 90
    min). DeepSpeed's init_distributed must return; the first run on a machine also builds the op here."""
    pytest.importorskip("deepspeed")
    extensions = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache/reinforce_pro/torch_extensions"))
    (extensions / SHM_OP).mkdir(parents=True, exist_ok=True)
    (extensions / SHM_OP / "lock").touch()
    code = (
        "from reinforce_pro.workers.base import setup_distributed\nfrom reinforce_pro.workers.configs import DistInfo\n"
        f"setup_distributed(DistInfo(init_method='file://{tmp_path}/rendezvous'))\n"
        "import torch.distributed as dist; print('world', dist.get_world_size())\n"
    )
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "world 1" in out.stdout and "left by a process that died" in out.stdout
    assert not (extensions / SHM_OP / "lock").exists()
