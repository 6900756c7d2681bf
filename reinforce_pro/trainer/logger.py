"""Metrics sinks: metrics.jsonl (always; one JSON object per step, appended and flushed), TensorBoard
(events under <save_path>/tensorboard unless --use_tensorboard names a directory) and Weights & Biases
(--use_wandb; WANDB_MODE=offline writes the run under <save_path>/wandb with no network).

Other per-step records go to their own jsonl files next to metrics.jsonl: `consumed.jsonl` (the dataset
indices of the prompts each step used) and `samples.jsonl` (a prompt / response / reward table every
--samples_log_steps steps, also logged to wandb as a table).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

SAMPLES_PER_TABLE = 8
# the per-step files a run writes in its directory (write's names): the only files a resume or restart cuts
RUN_JSONL = ("metrics", "consumed", "samples", "agent_steps")


@dataclass
class WandbConfig:
    key: str  # --use_wandb: an API key, or "offline" / "True" to use the environment's login or mode
    project: str
    group: str | None
    run_name: str
    org: str | None
    config: dict


class MetricsLogger:
    def __init__(
        self, run_dir: Path, tensorboard_dir: str | None = None, use_tensorboard: bool = True,
        wandb_cfg: WandbConfig | None = None,
    ):  # fmt: skip
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._files = {"metrics": open(self.path, "a", encoding="utf-8")}  # noqa: SIM115 - closed in close()
        self._tb = None
        if use_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(tensorboard_dir or str(self.run_dir / "tensorboard"))
        self._wandb = _init_wandb(wandb_cfg, self.run_dir) if wandb_cfg else None

    def log(self, step: int, metrics: dict[str, float], sinks: bool = True) -> None:
        """One step's row in metrics.jsonl (every step: the run's whole history, which summary.json and drift.png
        are made from), and with `sinks` in TensorBoard and wandb (--logging_steps)."""
        clean = {k: (v if math.isfinite(v) else None) for k, v in sorted(metrics.items())}
        self.write("metrics", {"step": step, **clean})
        if not sinks:
            return
        if self._tb is not None:
            for k, v in metrics.items():
                if math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in metrics.items() if math.isfinite(v)}, step=step)

    def add_figure(self, tag: str, figure, step: int) -> None:
        """A matplotlib figure into TensorBoard (the drift picture at the end of a run)."""
        if self._tb is not None:
            self._tb.add_figure(tag, figure, step, close=False)
            self._tb.flush()

    def write(self, name: str, row: dict) -> None:
        """Append one JSON row to <run_dir>/<name>.jsonl (a name of RUN_JSONL) and flush it."""
        if name not in RUN_JSONL:
            raise ValueError(f"{name}.jsonl is not one of the run's files (RUN_JSONL): a resume would not cut it")
        if name not in self._files:
            self._files[name] = open(self.run_dir / f"{name}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        f = self._files[name]
        f.write(json.dumps(row) + "\n")
        f.flush()

    def log_samples(self, step: int, prompts: list[str], responses: list[str], rewards) -> None:
        rows = [
            [step, p, r, float(rewards[i]) if rewards is not None else None]
            for i, (p, r) in enumerate(zip(prompts[:SAMPLES_PER_TABLE], responses, strict=False))
        ]
        for row in rows:
            self.write("samples", dict(zip(("step", "prompt", "response", "reward"), row, strict=True)))
        if self._wandb is not None:
            import wandb

            table = wandb.Table(columns=["step", "prompt", "response", "reward"], data=rows)
            self._wandb.log({"samples": table}, step=step)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _init_wandb(cfg: WandbConfig, run_dir: Path):
    import wandb

    offline = os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled") or cfg.key.lower() == "offline"
    if not offline and cfg.key.lower() not in ("true", "1"):
        wandb.login(key=cfg.key, relogin=True)
    return wandb.init(
        project=cfg.project, group=cfg.group, name=cfg.run_name, entity=cfg.org, config=cfg.config,
        dir=str(run_dir), mode="offline" if offline else None, reinit="finish_previous",
    )  # fmt: skip


def read_metrics(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
