"""--best_metric_key: `<run dir>/best_model/` always belongs to the history the run continues.

The best model is saved whenever an evaluation beats every earlier one, and a checkpoint keeps a copy of it as it
was at the checkpoint's step (hard links: nothing is written twice on one file system). A resume discards the
steps after its checkpoint, and with them any best model those steps saved: that one is moved aside (never
deleted: it was the best evaluation seen), and the checkpoint's copy is put back, so that best_model/, best.json
and the trainer's record of the best agree with the resumed history.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from reinforce_pro.trainer.checkpoint import link_tree

RECORD = "best.json"  # {"step", "key", "value"} of the model in the directory
IN_CHECKPOINT = "best_model"


def recorded(best_dir: Path) -> dict | None:
    """The record of the model in `best_dir`, None when there is none (or it cannot be read)."""
    try:
        return json.loads((best_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None


def keep_in_checkpoint(best_dir: Path | None, best: dict | None, ckpt_tmp: Path) -> None:
    """Copy best_model/ into the checkpoint being written when it holds the model of the run's record `best`."""
    if best_dir is not None and best is not None and recorded(best_dir) == best:
        link_tree(best_dir, ckpt_tmp / IN_CHECKPOINT)


def put_back(best_dir: Path | None, best: dict | None, ckpt: Path) -> tuple[dict | None, str | None]:
    """Make best_model/ the best model of the history that resumes from `ckpt`, whose state recorded `best`.
    Returns the record to go on with and a line to print, None when nothing had to change."""
    found = None if best_dir is None else recorded(best_dir)
    if best_dir is None or found == best:
        return best, None
    said = []
    if best_dir.exists():
        aside = _free_name(best_dir.with_name(f"{best_dir.name}.discarded-step{found['step'] if found else 'unknown'}"))
        best_dir.rename(aside)
        said.append(f"{best_dir.name}/ held a model of steps this resume discards; moved to {aside.name}/")
    if best is None:
        return None, "[best] " + "; ".join(said)
    copy = ckpt / IN_CHECKPOINT
    if recorded(copy) == best:
        tmp = best_dir.with_name(best_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        link_tree(copy, tmp)
        tmp.rename(best_dir)
        value = f"{best['key']} = {best['value']:.4f}"
        said.append(f"{best_dir.name}/ is step {best['step']}'s again ({value}), from {ckpt.name}")
        return best, "[best] " + "; ".join(said)
    said.append(f"{ckpt.name} keeps no copy of step {best['step']}'s best model: the next evaluation saves one")
    return None, "[best] " + "; ".join(said)


def _free_name(path: Path) -> Path:
    """`path`, or `path.N` for the first N not taken."""
    n = 1
    candidate = path
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.{n}")
        n += 1
    return candidate
