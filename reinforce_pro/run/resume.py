"""Where a run resumes: the newest complete checkpoint under --load_checkpoint, the run's per-step jsonl files
cut back to its step, and the default checkpoints' place under the run directory."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

from reinforce_pro.run.config import RunConfig, RunPlan
from reinforce_pro.trainer.checkpoint import find_latest, load_state, truncate_jsonl


def resume_checkpoint(cfg: RunConfig, plan: RunPlan) -> Path | None:
    """With --load_checkpoint: the latest complete checkpoint (None: start from scratch). The run's jsonl
    files are cut back to its step, so the resumed run appends to them without duplicates."""
    checkpoints = cfg.loop.checkpoints
    if checkpoints is None or not checkpoints.resume:
        return None
    ckpt = find_latest(checkpoints.ckpt_path)
    if ckpt is None:
        print(f"[resume] no complete checkpoint in {checkpoints.ckpt_path}: starting from scratch", flush=True)
        return None
    step = load_state(ckpt)["step"]
    for path in plan.run_dir.glob("*.jsonl"):  # every per-step file the run writes (MetricsLogger.write)
        truncate_jsonl(path, step)
    return ckpt


def run_checkpoints(cfg: RunConfig, plan: RunPlan) -> RunConfig:
    """The default checkpoints (--auto_checkpoint_minutes without --save_steps) go under the run directory."""
    ckpt = cfg.loop.checkpoints
    if ckpt is None or ckpt.ckpt_path is not None:
        return cfg
    return replace(cfg, loop=replace(cfg.loop, checkpoints=replace(ckpt, ckpt_path=plan.run_dir / "checkpoints")))


def resuming(cfg: RunConfig, plan: RunPlan, saved: Path | None) -> RunConfig:
    """The config the run starts again with after a lost actor: resumed from the newest checkpoint (its step's
    later rows cut from the jsonl files), or with no checkpoint yet from the first step (every row cut)."""
    if saved is None:
        for path in plan.run_dir.glob("*.jsonl"):
            truncate_jsonl(path, -1)  # the evaluation before training (step 0) is logged again too
        return cfg
    return replace(cfg, loop=replace(cfg.loop, checkpoints=replace(cfg.loop.checkpoints, resume=True)))


def checkpoint_line(cfg: RunConfig, plan: RunPlan, argv: list[str]) -> str | None:
    """The start line that says where the run checkpoints and the command that resumes it if it is killed
    (the driver itself included); None for a run that keeps no checkpoints."""
    ckpt = cfg.loop.checkpoints
    if ckpt is None or (ckpt.save_steps <= 0 and ckpt.every_s <= 0):
        return None
    when = f"every {ckpt.save_steps} steps" if ckpt.save_steps > 0 else f"every {ckpt.every_s / 60:g} min of training"
    return (f"[checkpoints] {when} into {ckpt.ckpt_path} (the newest {ckpt.max_ckpt_num} kept); if the run is "
            f"killed, this resumes it: {resume_command(argv, ckpt.ckpt_path, plan.run_dir)}")  # fmt: skip


def resume_command(argv: list[str], ckpt_dir: Path, run_dir: Path) -> str:
    """The command line `argv` ran, with what resumes it from the checkpoints in `ckpt_dir` into `run_dir`."""
    again = ["python", "-m", "reinforce_pro.cli.train_ppo_ray", *argv]
    return shlex.join([*again, "--load_checkpoint", "--ckpt_path", str(ckpt_dir), "--save_path", str(run_dir)])
