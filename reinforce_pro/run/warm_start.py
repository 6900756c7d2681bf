"""The warm start, a stage of its own: without --pretrain a run trains the built-in model (models/tiny.py) by
supervised steps on the task it will learn by RL (the built-in task's examples, or both self-play roles'
demonstrations) until its greedy accuracy reaches --sft_warmup_target or --sft_warmup_steps run out, so that RL
starts from a policy that sometimes earns reward. run/prepare.py calls it once the inputs are checked."""

from __future__ import annotations

from pathlib import Path

from reinforce_pro.run.config import RunConfig

WARM_START_BASES = 20  # other generated knowledge bases whose questions demonstrate an episode task's formats


def built_in_model(cfg: RunConfig, run_dir: Path, summary: dict, task=None) -> str:
    """The built-in model; warm-started on the built-in task (or the self-play task's examples of both
    roles) when that is what we train on."""
    from reinforce_pro.data import EMBEDDED_TASKS
    from reinforce_pro.models.tiny import build_tiny_model, build_tiny_moe_model
    from reinforce_pro.trainer.sft_warmup import embedded_warm_start

    layers = 2 if task else EMBEDDED_TASKS[cfg.data.builtin_task]().model_layers
    positions = getattr(task, "tiny_model_positions", None) or 256  # task files are duck-typed
    build = build_tiny_moe_model if cfg.models.embedded_model == "moe" else build_tiny_model
    base = build(run_dir / "base_model", seed=cfg.seed, num_layers=layers, max_positions=positions)
    steps, out = cfg.models.sft_warmup_steps, run_dir / "warmstart"
    if not cfg.data.built_in or steps <= 0:
        return str(base)
    if task:
        stats = selfplay_warm_start(task, base, out, steps, cfg.seed, cfg.models.sft_warmup_target)
        if stats is None:
            return str(base)
    else:
        stats = embedded_warm_start(cfg.data.builtin_task, base, out, steps, cfg.seed,
                                    cfg.models.sft_warmup_target, cfg.rollout.max_new_tokens)  # fmt: skip
    summary.update(stats)
    print(f"[warm start] {stats['sft/steps']} SFT steps: loss {stats['sft/loss_first']:.3f} -> "
          f"{stats['sft/loss_last']:.3f}", flush=True)  # fmt: skip
    return str(out)


def selfplay_warm_start(task, base: Path, out: Path, steps: int, seed: int, target: float) -> dict | None:
    """Both roles' warm start: demonstrations with environment turns (a task whose solver answers in episodes),
    else prompt / answer examples; None when the task has neither. With `target` > 0 and a task that can
    measure its solver during the warm start (warm_start_stop), it stops once that accuracy reaches `target`."""
    from transformers import AutoTokenizer

    from reinforce_pro.trainer.sft_warmup import sft_on_sequences, sft_warm_start

    if hasattr(task, "warm_start_sequences"):
        tokenizer = AutoTokenizer.from_pretrained(base)
        sequences = task.warm_start_sequences(tokenizer, WARM_START_BASES, seed=seed + 1)
        if sequences:
            measured = target > 0 and hasattr(task, "warm_start_stop")
            stop = task.warm_start_stop(target, seed + 2) if measured else None
            return sft_on_sequences(base, out, sequences, steps=steps, seed=seed, stop=stop)
    examples = task.warm_start_examples(2048, seed=seed + 1)
    return sft_warm_start(base, out, examples, steps=steps, seed=seed) if examples else None
