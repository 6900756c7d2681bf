"""Where a run resumes: the newest complete checkpoint under --load_checkpoint, the run's per-step jsonl files
cut back to its step, and the default checkpoints' place under the run directory. The same command run again
into the run directory it named (--save_path) resumes the run it started there (`rerun`)."""

from __future__ import annotations

import json
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


def run_checkpoints(cfg: RunConfig, run_dir: Path) -> RunConfig:
    """The default checkpoints (--auto_checkpoint_minutes without --save_steps) go under the run directory."""
    ckpt = cfg.loop.checkpoints
    if ckpt is None or ckpt.ckpt_path is not None:
        return cfg
    return replace(cfg, loop=replace(cfg.loop, checkpoints=replace(ckpt, ckpt_path=run_dir / "checkpoints")))


def resuming(cfg: RunConfig, run_dir: Path, saved: Path | None) -> RunConfig:
    """The config the run starts again with after a lost actor: resumed from the newest checkpoint (its step's
    later rows cut from the jsonl files), or with no checkpoint yet from the first step (every row cut)."""
    if saved is None:
        for path in run_dir.glob("*.jsonl"):
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


COMMAND_FILE = "command.json"  # the run directory's record of the config its command asked for (rerun reads it)
DEFAULT_RUNS = Path("runs")  # where a run without --save_path gets its runs/<time> directory (run/prepare.py)


def asked(cfg: RunConfig) -> dict:
    """The config as the command asked for it, without what differs between two starts of the same command
    (whether it resumes, wandb's run name stamped with the time, the run directory found for it)."""
    out = json.loads(json.dumps(cfg.as_dict(), default=str))
    if out["loop"]["checkpoints"]:
        out["loop"]["checkpoints"].pop("resume")
    if out["output"]["wandb"]:
        out["output"]["wandb"].pop("run_name")
    out["output"].pop("save_path")
    return out


def rerun(cfg: RunConfig) -> RunConfig:
    """Before a command prepares its run, the run directory it resumes, if any. With --save_path: a run there that
    trained a step, of the same command (command.json), and not finished, is resumed as --load_checkpoint would,
    from its newest complete checkpoint, or with none from the first step, the old rows cut; a finished run or
    one of another command is moved aside to <save_path>.<n> (nothing lost) and a new run starts. Without
    --save_path: the newest runs/<time>/ of the same command that trained a step and did not finish is resumed
    (its directory becomes the run's --save_path); none, a new runs/<time>/. Returns the config to run."""
    now = asked(cfg)  # before the run directory fills in anything
    found = None if cfg.output.save_path else _unfinished_run(now)
    if found is not None:
        cfg = replace(cfg, output=replace(cfg.output, save_path=str(found)))
    if not cfg.output.save_path:
        return cfg
    run_dir = Path(cfg.output.save_path).resolve()
    cfg, record = run_checkpoints(cfg, run_dir), run_dir / COMMAND_FILE  # record_command writes it, once prepared
    explicit = cfg.loop.checkpoints is not None and cfg.loop.checkpoints.resume
    if not explicit and _trained_a_step(run_dir):
        previous = json.loads(record.read_text()) if record.is_file() else None
        why = _not_resumable(previous, now, run_dir)
        if why is None:
            saved = find_latest(cfg.loop.checkpoints.ckpt_path) if cfg.loop.checkpoints else None
            print(f"[resume] {run_dir} holds this command's run: resuming it from "
                  f"{saved or 'the first step (no checkpoint yet)'} (a new run instead: give a new --save_path)",
                  flush=True)  # fmt: skip
            cfg = resuming(cfg, run_dir, saved)
        else:
            aside = next(run_dir.with_name(f"{run_dir.name}.{n}") for n in range(1, 10**6)
                         if not run_dir.with_name(f"{run_dir.name}.{n}").exists())  # fmt: skip
            run_dir.rename(aside)
            print(f"[run] {run_dir} held {why}: moved to {aside}; a new run starts", flush=True)
    return cfg


def record_command(command: dict, run_dir: Path) -> None:
    """command.json: `command` (asked(cfg) of the config as given), what a later start of the same command
    compares itself with (rerun)."""
    (run_dir / COMMAND_FILE).write_text(json.dumps(command, indent=2) + "\n")


def _not_resumable(previous: dict | None, now: dict, run_dir: Path) -> str | None:
    """Why the run in `run_dir` is not this command's to resume (None: it is)."""
    if previous is None:
        return "a run that recorded no command"
    if previous != now:
        return f"a run of another command ({', '.join(_differences(previous, now)[:3])})"
    if (run_dir / "final_model").is_dir():
        return "this command's finished run"
    return None


def _unfinished_run(now: dict) -> Path | None:
    """The newest runs/<time>/ whose command.json is `now`, that trained a step and did not finish."""
    records = sorted(DEFAULT_RUNS.glob(f"*/{COMMAND_FILE}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for record in records:
        try:
            previous = json.loads(record.read_text())
        except (OSError, ValueError):  # a record cut short: not this command's
            continue
        if _trained_a_step(record.parent) and _not_resumable(previous, now, record.parent) is None:
            return record.parent.resolve()
    return None


def _trained_a_step(run_dir: Path) -> bool:
    """Whether metrics.jsonl holds a training step (an attempt that stopped before one leaves nothing to keep);
    a last line cut short by the kill is not one."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return False
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                if json.loads(line).get("step", 0) >= 1:
                    return True
            except ValueError:
                continue
    return False


def _differences(before, now, at: str = "") -> list[str]:
    """The dotted config keys whose values differ, with both values."""
    if isinstance(before, dict) and isinstance(now, dict):
        keys = sorted(set(before) | set(now))
        return [d for k in keys for d in _differences(before.get(k), now.get(k), f"{at}{k}.")]
    return [] if before == now else [f"{at[:-1]}: {before} -> {now}"]
