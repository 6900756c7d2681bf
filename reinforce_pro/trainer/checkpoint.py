"""Checkpoints of a run under --ckpt_path: write, then rename; find the last complete one; rotate.

Layout of one checkpoint, `<ckpt_path>/global_step<N>/`:
  policy/        DeepSpeed states of the policy (weights, optimizer, scheduler; one shard file per rank)
  critic/        the same for the critic, when there is one
  policy_hf/     with --save_hf_ckpt: the policy as an HF model directory
  best_model/    with --best_metric_key: the run's best_model/ as it was at this step (hard links where the
                 file system allows), so that a resume puts back the best model of the history it continues
  trainer_state.json   step, prompt-stream position, KL controller, reward statistics, RNG states

It is written as `global_step<N>.tmp/` and renamed when every part is on disk, then `latest` (a text file
with the directory name) is replaced atomically. A run killed while saving leaves a `.tmp` directory
that is never taken for a checkpoint and is removed by the next save.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

STATE_FILE = "trainer_state.json"
LATEST = "latest"
PREFIX = "global_step"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CheckpointClash(ValueError):
    """A checkpoint this run would write is in the way of another run's (two live runs share a --ckpt_path)."""


def save_checkpoint(root: Path, step: int, state: dict, write_parts: Callable[[Path], None]) -> Path:
    """Write checkpoint `step` under `root`: `write_parts(tmp_dir)` writes the model states, then the trainer
    state is added and the directory renamed into place. Returns the final directory."""
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / f"{PREFIX}{step}", root / f"{PREFIX}{step}.tmp"
    for stale in root.glob(f"{PREFIX}*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    if final.exists() and (final / STATE_FILE).is_file() and not ours(final, state.get("run_id")):
        raise CheckpointClash(f"{final} is run {owner(final)}'s checkpoint: another run writes checkpoints into "
                              f"{root}; this one is not saved (give each run its own --ckpt_path)")  # fmt: skip
    tmp.mkdir()
    write_parts(tmp)
    _sync_tree(tmp)  # the shards on disk before the rename makes them a checkpoint (a power cut keeps none half)
    _write_atomic(tmp / STATE_FILE, json.dumps({"step": step, **state}, indent=2))
    if final.exists():  # saved again at the same step (a resumed run): replace
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)  # the rename on disk before `latest` names it
    _write_atomic(root / LATEST, final.name + "\n")
    return final


def _sync_tree(root: Path) -> None:
    """fsync every file under `root`, then the directories, deepest first."""
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_file() or path.is_dir():
            _fsync(path)
    _fsync(root)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint directories under `root`, oldest step first."""
    if not root.is_dir():
        return []
    found = []
    for d in root.glob(f"{PREFIX}*"):
        suffix = d.name[len(PREFIX) :]
        if d.is_dir() and suffix.isdigit() and (d / STATE_FILE).is_file():
            found.append((int(suffix), d))
    return [d for _, d in sorted(found)]


def find_latest(root: Path, run_id: str | None = None) -> Path | None:
    """The checkpoint a run resumes from: the directory `latest` names if complete, else the newest complete one,
    leaving out those that hold no model states to load (--disable_ds_ckpt; trainer_state's `resumable`) and,
    given `run_id`, those another run wrote (`owner`); None when there is none."""
    pointer = root / LATEST
    if pointer.is_file():
        named = root / pointer.read_text(errors="replace").strip()
        if (named / STATE_FILE).is_file() and resumable(named) and ours(named, run_id):
            return named
    done = [d for d in complete_checkpoints(root) if resumable(d) and ours(d, run_id)]
    return done[-1] if done else None


def resumable(ckpt: Path) -> bool:
    """Whether a complete checkpoint holds the model states a resume loads (one whose state cannot be read does
    not)."""
    try:
        return bool(load_state(ckpt).get("resumable", True))
    except (OSError, ValueError):
        return False


def owner(ckpt: Path) -> str | None:
    """The id of the run that wrote a checkpoint (trainer_state's `run_id`; None: written before runs recorded
    one, or unreadable)."""
    try:
        found = load_state(ckpt).get("run_id")
    except (OSError, ValueError):
        return None
    return found if isinstance(found, str) else None


def ours(ckpt: Path, run_id: str | None) -> bool:
    """Whether `run_id`'s run may take a checkpoint as its own: one it wrote, or one that names no run (written
    before ids were recorded); any checkpoint when no run is named."""
    found = owner(ckpt)
    return run_id is None or found is None or found == run_id


def others(root: Path, run_id: str) -> list[Path]:
    """The complete checkpoints under `root` that another run wrote."""
    return [d for d in complete_checkpoints(root) if not ours(d, run_id)]


def load_state(ckpt: Path) -> dict:
    return json.loads((ckpt / STATE_FILE).read_text())


def rotate(root: Path, max_num: int, max_mem_gb: float, run_id: str | None = None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond `max_num`, then while the rest exceed `max_mem_gb`
    (the newest is always kept); given `run_id`, only that run's are counted and deleted (never another run's,
    and never this run's newest for another's). Returns the deleted directories."""
    done = [d for d in complete_checkpoints(root) if ours(d, run_id)]
    deleted = []
    while len(done) > max(1, max_num) or (len(done) > 1 and sum(map(_size, done)) > max_mem_gb * 1024**3):
        oldest = done.pop(0)
        shutil.rmtree(oldest)
        deleted.append(oldest)
    return deleted


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def link_tree(src: Path, dst: Path) -> None:
    """`dst` a copy of directory `src`, by hard links where the file system allows (a copy otherwise). Safe for
    model directories that are only ever replaced whole (written beside, then renamed), never written in place."""
    for path in sorted(src.rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:  # another file system, or one without hard links
            shutil.copy2(path, target)


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep the rows of a per-step jsonl file with step <= last_step (rows logged after the checkpoint a
    run resumes from are logged again by the resumed run). Written to a temporary file, then renamed."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():  # a mangled byte: not UTF-8
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the kill
            continue
        if row.get("step", 0) <= last_step:
            keep.append(line)
    _write_atomic(path, "".join(line + "\n" for line in keep))
