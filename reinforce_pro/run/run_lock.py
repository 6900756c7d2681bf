"""One live run per run directory: the driver holds an exclusive flock on <run_dir>/.run.lock from before it
reads or changes anything there until it exits.

The kernel drops the lock when the process ends, however it ends (kill -9, an out-of-memory kill, a node
reboot), so a killed run can be resumed at once, and no stale lock file ever has to be removed by hand. A second
start meets the lock and stops in one line naming the live run's process, before it cuts, moves or writes
anything: two starts of one --save_path (a SLURM array, a sweep started with `&`), or of one command without
--save_path while the first still runs, never share a directory. The lock file records who holds it (pid, host,
start time) only to say so; the flock is what holds.

flock locks a directory on the local file system; on NFS it is emulated with fcntl locks where the mount allows
(Linux >= 2.6.12), otherwise taking it fails and is said as such.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from reinforce_pro.run.errors import UserInputError

LOCK_FILE = ".run.lock"
_held: dict[Path, int] = {}  # run directory -> the open lock file's descriptor, for this process's life


def claim(run_dir: Path) -> None:
    """Hold `run_dir` (which exists) for this process; a directory another live process holds is refused with
    one line naming it."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held:
        return
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UserInputError(f"{run_dir}: cannot create its lock file {LOCK_FILE} ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = _holder(fd)
        os.close(fd)
        if isinstance(e, BlockingIOError):
            raise UserInputError(f"{run_dir} belongs to a live run ({holder}): give this one another --save_path, "
                                 "or stop that run first") from None  # fmt: skip
        raise UserInputError(f"{run_dir}: cannot lock it for this run ({e.strerror})") from None
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    _held[run_dir] = fd


def release(run_dir: Path) -> None:
    """Let `run_dir` go (it was moved aside, or the run is over); nothing if this process does not hold it."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor of the open file drops the flock


def release_all() -> None:
    """Let every directory this process holds go (a run's start and end, train())."""
    for run_dir in list(_held):
        release(run_dir)


def holder(run_dir: Path) -> str | None:
    """Who holds `run_dir` if another live process does (its pid, host and start), else None."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held or not (run_dir / LOCK_FILE).is_file():
        return None
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # granted (then dropped at close) unless someone holds it
        return None
    except BlockingIOError:
        return _holder(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode())
        return f"pid {record['pid']} on {record['host']}, started {record['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet said which"
