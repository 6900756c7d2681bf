"""Where a run resumes: the newest complete checkpoint under --load_checkpoint, the run's per-step jsonl files
cut back to its step, and the default checkpoints' place under the run directory. The same command run again
into the run directory it named (--save_path) resumes the run it started there (`rerun`). A run directory is
one live run's (run/run_lock.py): a start that finds it held stops before it reads or changes anything there,
and only the files the run writes (trainer/logger.RUN_JSONL) are ever cut, once its inputs have been checked."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import uuid
from dataclasses import replace
from pathlib import Path

from reinforce_pro.run import run_lock
from reinforce_pro.run.config import RunConfig, RunPlan
from reinforce_pro.run.errors import UserInputError
from reinforce_pro.trainer.checkpoint import find_latest, load_state, others, owner, truncate_jsonl
from reinforce_pro.trainer.logger import RUN_JSONL


def resume_checkpoint(cfg: RunConfig, plan: RunPlan) -> Path | None:
    """With --load_checkpoint: the latest complete checkpoint (None: start from scratch). The run's jsonl
    files are cut back to its step, so the resumed run appends to them without duplicates."""
    checkpoints = cfg.loop.checkpoints
    if checkpoints is None or not checkpoints.resume:
        return None
    ckpt = latest(cfg)
    if ckpt is None:
        print(f"[resume] no complete checkpoint in {checkpoints.ckpt_path}: starting from scratch", flush=True)
        return None
    cut_rows(plan.run_dir, load_state(ckpt)["step"])
    return ckpt


def cut_rows(run_dir: Path, step: int) -> None:
    """Cut the run's own per-step files (MetricsLogger's RUN_JSONL, nothing else the directory holds: --save_path .
    beside a user's prompts.jsonl) back to `step` (-1: every row, the evaluation before training included)."""
    for name in RUN_JSONL:
        truncate_jsonl(run_dir / f"{name}.jsonl", step)


def latest(cfg: RunConfig) -> Path | None:
    """The newest complete checkpoint this run can resume from (its own: checkpoint.find_latest with its id)."""
    ckpt = cfg.loop.checkpoints
    return find_latest(ckpt.ckpt_path, ckpt.run_id) if ckpt is not None else None


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
        cut_rows(run_dir, -1)  # the evaluation before training (step 0) is logged again too
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


# What a start may change and still continue the same run: how it is run, logged, evaluated and checkpointed, not
# what it trains (the flags people change after a failure: --verbose, --max_failures, --engine_timeout_s,
# --eval_steps, --logging_steps, --max_ckpt_num, and the --ckpt_path the printed resume command adds)
RUNNING = ("output", "evaluation", "rollout.engine_timeout_s", "loop.engine_timeout_s", "loop.max_failures",
           "loop.logging_steps", "loop.samples_log_steps", "loop.eval_steps", "loop.eval_before_training",
           "loop.best_metric_key", "loop.best_model_dir", "loop.checkpoints")  # fmt: skip
FINGERPRINTS = "fingerprints"  # command.json's key: every path the command names -> what it held
HASHED_BYTES = 8 << 20  # files up to this size are fingerprinted by their bytes, larger ones by size and mtime


def asked(cfg: RunConfig) -> dict:
    """The config as the command asked for it, without what differs between two starts of the same command
    (whether it resumes, wandb's run name stamped with the time, the run directory found for it), and the
    fingerprint of every file or directory it names (its data, weights, reward and agent code), so that changed
    contents behind an unchanged path are another command."""
    out = json.loads(json.dumps(cfg.as_dict(), default=str))
    if out["loop"]["checkpoints"]:
        out["loop"]["checkpoints"].pop("resume")
    if out["output"]["wandb"]:
        out["output"]["wandb"].pop("run_name")
    out["output"].pop("save_path")
    out[FINGERPRINTS] = {path: fingerprint(Path(path)) for path in sorted(_named_paths(_trained(out)))}
    return out


def _trained(config: dict) -> dict:
    """`config` without the RUNNING keys, every path it names spelled absolute (./m and /abs/m are one model)."""
    out = json.loads(json.dumps(config))
    out.pop(FINGERPRINTS, None)
    out.pop("run_id", None)
    for dotted in RUNNING:
        *parents, key = dotted.split(".")
        section = out
        for parent in parents:
            section = section.get(parent) if isinstance(section, dict) else None
        if isinstance(section, dict):
            section.pop(key, None)
    return _absolute(out)


def _absolute(value):
    if isinstance(value, dict):
        return {k: _absolute(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_absolute(v) for v in value]
    if isinstance(value, str) and _is_path(value):
        return str(Path(value).expanduser().resolve())
    return value


def _is_path(value: str) -> bool:
    return value not in ("", ".") and "://" not in value and os.path.exists(os.path.expanduser(value))


def _named_paths(value) -> set[str]:
    if isinstance(value, dict):
        return {p for v in value.values() for p in _named_paths(v)}
    if isinstance(value, list):
        return {p for v in value for p in _named_paths(v)}
    return {value} if isinstance(value, str) and _is_path(value) else set()


def fingerprint(path: Path) -> str:
    """What a file holds (sha256 of its bytes up to HASHED_BYTES, else its size and mtime), or a directory's files
    at its top level (a model directory: config, tokenizer, weights), so a changed file makes another command."""
    try:
        if path.is_dir():
            entries = sorted(p for p in path.iterdir() if p.is_file())[:256]
            return hashlib.sha256("".join(f"{p.name}={fingerprint(p)};" for p in entries).encode()).hexdigest()[:16]
        stat = path.stat()
        if stat.st_size > HASHED_BYTES:
            return f"size {stat.st_size}, mtime {stat.st_mtime_ns}"
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()[:16]
    except OSError as e:
        return f"unreadable ({e.strerror})"


def rerun(cfg: RunConfig, command: dict | None = None) -> tuple[RunConfig, bool]:
    """Before a command prepares its run, the run directory it resumes, if any. With --save_path: a run there that
    trained a step, of the same command (command.json), and not finished, is resumed as --load_checkpoint would,
    from its newest complete checkpoint, or with none from the first step; a finished run or one of another
    command is moved aside to <save_path>.<n> (nothing lost) and a new run starts. Without --save_path: the newest
    runs/<time>/ of the same command that trained a step, did not finish and no live run holds is resumed (its
    directory becomes the run's --save_path); none, a new runs/<time>/. A directory a live run holds is refused
    (run_lock), and otherwise held from here on. Returns the config to run and whether the old rows must be cut
    (a resume from the first step: cut_rows(run_dir, -1), once prepare has checked the inputs). `command`:
    asked(cfg), where the caller has it already (it hashes the files the command names)."""
    now = command if command is not None else asked(cfg)  # before the run directory fills in anything
    found = None if cfg.output.save_path else _unfinished_run(now)
    if found is not None:
        cfg = replace(cfg, output=replace(cfg.output, save_path=str(found)))
    if not cfg.output.save_path:
        return _owned(cfg, None), False
    run_dir = Path(cfg.output.save_path).resolve()
    if run_dir.is_dir():
        run_lock.claim(run_dir)  # before anything here is read, moved or cut
    cfg, record = run_checkpoints(cfg, run_dir), run_dir / COMMAND_FILE  # record_command writes it, once prepared
    if _trained_a_step(run_dir):  # --load_checkpoint too: it continues this command's run, not another's
        previous = read_command(record)
        why = _not_resumable(previous, now, run_dir)
        if why is None:
            cfg = _owned(cfg, previous.get("run_id"))
            saved = latest(cfg)
            changed = _differences(_without_fingerprints(previous), _without_fingerprints(now))  # none trained
            note = f"; changed, not what it trains: {', '.join(changed[:4])}" if changed else ""
            print(f"[resume] {run_dir} holds this command's run: resuming it from "
                  f"{saved or 'the first step (no checkpoint yet)'} (a new run instead: give a new --save_path)"
                  f"{note}", flush=True)  # fmt: skip
            if saved is None:
                return cfg, True
            return resuming(cfg, run_dir, saved), False
        else:
            aside = next(run_dir.with_name(f"{run_dir.name}.{n}") for n in range(1, 10**6)
                         if not run_dir.with_name(f"{run_dir.name}.{n}").exists())  # fmt: skip
            try:
                run_dir.rename(aside)
            except OSError as e:  # a mount point, a read-only parent
                raise UserInputError(f"{run_dir} holds {why}, and moving it aside to {aside} failed ({e.strerror}): "
                                     "give this run another --save_path") from None  # fmt: skip
            run_lock.release(run_dir)  # the lock went with the old run; prepare takes the new directory's
            print(f"[run] {run_dir} held {why}: moved to {aside}; a new run starts", flush=True)
    return _owned(cfg, None), False


def _owned(cfg: RunConfig, run_id: str | None) -> RunConfig:
    """`cfg` with its run's id on its checkpoints: a resumed run's own (`run_id`), else a new one. A new run whose
    --ckpt_path holds another run's checkpoints takes them over with --load_checkpoint (it continues that run's
    weights and state as a new run, and says so), and is refused in one line without it (they would be rotated
    away, or overwritten at the same step)."""
    ckpt = cfg.loop.checkpoints
    if ckpt is None:
        return cfg
    ckpt = replace(ckpt, run_id=run_id or uuid.uuid4().hex[:12])
    foreign = others(ckpt.ckpt_path, ckpt.run_id) if ckpt.ckpt_path is not None and run_id is None else []
    taken = find_latest(ckpt.ckpt_path) if foreign and ckpt.resume else None
    if taken is not None:
        ckpt = replace(ckpt, run_id=owner(taken))
        print(
            f"[resume] --load_checkpoint: {taken} is another run's (run {owner(taken)}); this run continues its "
            "weights and state as a new run in its own directory, its checkpoints beside that run's",
            flush=True,
        )
    elif foreign:
        names = ", ".join(d.name for d in foreign[-3:])
        raise UserInputError(f"--ckpt_path {ckpt.ckpt_path} holds another run's checkpoints ({names}, run "
                             f"{owner(foreign[-1])}): give this run a --ckpt_path of its own (without one, its "
                             "checkpoints go under its run directory), or --load_checkpoint to continue that "
                             "run")  # fmt: skip
    return replace(cfg, loop=replace(cfg.loop, checkpoints=ckpt))


def record_command(command: dict, run_dir: Path, run_id: str | None = None) -> None:
    """command.json: `command` (asked(cfg) of the config as given), what a later start of the same command
    compares itself with (rerun), and the run's id (its checkpoints carry it); written to a temporary file and
    renamed, so a kill never leaves half of it."""
    command = {**command, "run_id": run_id} if run_id is not None else command
    path = run_dir / COMMAND_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(command, indent=2) + "\n")
    os.replace(tmp, path)


def read_command(record: Path) -> dict | None:
    """A run directory's command.json; None where there is none or it cannot be read (cut short, not JSON)."""
    try:
        found = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _without_fingerprints(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in (FINGERPRINTS, "run_id")}


def _not_resumable(previous: dict | None, now: dict, run_dir: Path) -> str | None:
    """Why the run in `run_dir` is not this command's to resume (None: it is): another config for what is trained
    (RUNNING keys aside, paths compared as absolute), or other contents behind a path it names (a record written
    before fingerprints were kept is compared by its config alone)."""
    if previous is None:
        return "a run that recorded no command"
    if _trained(previous) != _trained(now):
        return f"a run of another command ({', '.join(_differences(_trained(previous), _trained(now))[:3])})"
    before, after = previous.get(FINGERPRINTS), now[FINGERPRINTS]
    if before is not None and before != after:
        changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
        return f"a run of another command (other contents in {', '.join(changed[:3])})"
    if (run_dir / "final_model").is_dir():
        return "this command's finished run"
    return None


def _unfinished_run(now: dict) -> Path | None:
    """The newest runs/<time>/ whose command.json is `now`, that trained a step, did not finish and no live run
    holds (a second start of a command while its first still runs starts a run of its own)."""
    records = sorted(DEFAULT_RUNS.glob(f"*/{COMMAND_FILE}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for record in records:
        if run_lock.holder(record.parent) is not None:
            continue
        previous = read_command(record)  # None (a record cut short): not this command's
        if _trained_a_step(record.parent) and _not_resumable(previous, now, record.parent) is None:
            return record.parent.resolve()
    return None


def _trained_a_step(run_dir: Path) -> bool:
    """Whether metrics.jsonl holds a training step (an attempt that stopped before one leaves nothing to keep);
    a last line cut short by the kill is not one."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return False
    with path.open(encoding="utf-8", errors="replace") as f:  # a byte the file system mangled: that line is not a row
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
