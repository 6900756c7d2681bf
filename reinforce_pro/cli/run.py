"""What `train_ppo_ray.main` does after the flags are valid: check inputs, build the run, start Ray, fit."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from reinforce_pro.data.prompts import DataError, PromptSpec, build_prompts, load_records
from reinforce_pro.rewards.loader import RewardFileError, load_reward_func


class UserInputError(ValueError):
    """A path or file the user gave is missing or unusable: reported in one line, exit status 2."""


@dataclass
class RunPlan:
    run_dir: Path
    pretrain: str  # the policy's starting weights (after the warm start for the embedded default)
    prompts: list[dict]  # [{"prompt", "label"}]
    reward_source: str  # "builtin:exact_match" | path of a reward file | "model:<dir>"
    summary: dict


def _check_model_dir(flag: str, path: str | None) -> None:
    if path is not None and not (Path(path) / "config.json").is_file():
        raise UserInputError(f"{flag} {path}: not a local HF model directory (no config.json)")


def prepare(args) -> RunPlan:
    for flag in ("pretrain", "critic_pretrain", "reward_pretrain"):
        _check_model_dir(f"--{flag}", getattr(args, flag))
    if args.remote_rm_url:
        try:
            load_reward_func(args.remote_rm_url)
        except RewardFileError as e:
            raise UserInputError(str(e)) from None
    run_dir = Path(args.save_path or f"runs/{datetime.now().strftime('%Y%m%d-%H%M%S')}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    summary: dict = {}
    pretrain = args.pretrain or _tiny_model(args, run_dir, summary)
    try:
        prompts = _prompts(args, pretrain)
    except DataError as e:
        raise UserInputError(str(e)) from None
    if not prompts:
        raise UserInputError("no prompts to train on")
    if len(prompts) < args.rollout_batch_size:
        raise UserInputError(f"{len(prompts)} prompts, fewer than --rollout_batch_size {args.rollout_batch_size}")
    if args.remote_rm_url:
        source = str(Path(args.remote_rm_url).resolve())
    elif args.reward_pretrain:
        source = f"model:{args.reward_pretrain}"
    else:
        source = "builtin:exact_match"
    (run_dir / "args.json").write_text(json.dumps(vars(args), indent=2, default=str) + "\n")
    return RunPlan(run_dir, pretrain, prompts, source, summary)


def _tiny_model(args, run_dir: Path, summary: dict) -> str:
    """The built-in model; warm-started on the built-in task when that is what we train on."""
    from reinforce_pro.models.tiny import build_tiny_model
    from reinforce_pro.trainer.sft_warmup import arithmetic_warm_start

    base = build_tiny_model(run_dir / "base_model", seed=args.seed)
    if args.prompt_data is not None or args.sft_warmup_steps <= 0:
        return str(base)
    stats = arithmetic_warm_start(base, run_dir / "warmstart", steps=args.sft_warmup_steps, seed=args.seed)
    summary.update(stats)
    print(f"[warm start] {args.sft_warmup_steps} SFT steps: loss {stats['sft/loss_first']:.3f} -> "
          f"{stats['sft/loss_last']:.3f}", flush=True)  # fmt: skip
    return str(run_dir / "warmstart")


def _prompts(args, pretrain: str) -> list[dict]:
    from transformers import AutoTokenizer

    from reinforce_pro.data.arithmetic import arithmetic_records

    tokenizer = AutoTokenizer.from_pretrained(pretrain, use_fast=not args.disable_fast_tokenizer)
    if args.prompt_data is None:
        records = arithmetic_records(min(args.max_samples, 100_000), seed=args.seed)
        spec = PromptSpec("input", "label", args.input_template, args.apply_chat_template)
        source = "built-in arithmetic"
    else:
        records = load_records(args.prompt_data, args.prompt_split)[: args.max_samples]
        spec = PromptSpec(args.input_key, args.label_key, args.input_template, args.apply_chat_template)
        source = args.prompt_data
    return build_prompts(records, spec, tokenizer, source)


def run(args, plan: RunPlan) -> int:
    from reinforce_pro.cli.wiring import build_and_fit

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    history = build_and_fit(args, plan)
    return _summarise(history, plan)


def _summarise(history: list[dict], plan: RunPlan) -> int:
    rewards = [h["rollout/reward_mean"] for h in history]
    k = min(5, len(rewards))
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    summary = {
        **plan.summary,
        "steps": len(rewards),
        "reward_first5": first,
        "reward_last5": last,
        "reward_gain": last - first,
        "wall_s": sum(h["time/step"] for h in history),
        "final_model": str(plan.run_dir / "final_model"),
    }
    (plan.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"\n[done] {len(rewards)} steps; mean reward of the first {k} steps {first:.3f}, of the last {k} "
        f"{last:.3f} (gain {last - first:+.3f}). Run directory: {plan.run_dir}",
        file=sys.stdout,
        flush=True,
    )
    return 0
