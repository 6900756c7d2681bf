"""The critic (only for --advantage_estimator gae): values for GAE and value-loss updates."""

from __future__ import annotations

import torch

from reinforce_pro.algos.losses import ValueLoss
from reinforce_pro.algos.stats import Stat
from reinforce_pro.experience import Experience
from reinforce_pro.models.value import ValueModel
from reinforce_pro.procs import capture_output
from reinforce_pro.workers.base import (
    device,
    initialize_deepspeed,
    load_engine_state,
    optimizer_step_stats,
    row_chunks,
    save_engine_state,
    setup_distributed,
)
from reinforce_pro.workers.configs import DistInfo, ForwardConfig, OptimConfig


class CriticWorker:
    """One data-parallel rank of the critic. Wrapped with ray.remote by the launcher."""

    def __init__(
        self,
        model_path: str,
        opt: OptimConfig,
        dist: DistInfo,
        seed: int,
        value_clip: float | None,
        head_name: str,
        forward: ForwardConfig,
    ):
        capture_output(f"critic_rank{dist.rank}")
        setup_distributed(dist)
        torch.manual_seed(seed + 1000 + dist.rank)
        self.opt, self.dist = opt, dist
        self.forward = forward
        model = ValueModel(model_path, head_name, forward.attn_implementation, forward.packing_samples)
        self.engine = initialize_deepspeed(model, opt, dist.world_size)
        self.loss_fn = ValueLoss(clip_eps=value_clip)

    @torch.no_grad()
    def values(self, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int) -> torch.Tensor:
        self.engine.eval()
        dev, out = device(), []
        for rows in row_chunks(attention_mask, self.forward.micro_batch_size, self.forward.max_tokens):
            out.append(self.engine(sequences[rows].to(dev), attention_mask[rows].to(dev), num_actions).cpu())
        return torch.cat(out)

    def train_minibatch(
        self, micro_batches: list[Experience], global_tokens: float, global_seqs: float
    ) -> dict[str, Stat]:
        """One optimizer step over this rank's micro-batches (see PolicyWorker.train_minibatch): its metrics."""
        self.engine.train()
        dev, history = device(), []
        for i, exp in enumerate(micro_batches):
            self.engine.set_gradient_accumulation_boundary(i == len(micro_batches) - 1)  # see PolicyWorker
            exp = exp.trim_padding()
            values = self.engine(exp.sequences.to(dev), exp.attention_mask.to(dev), exp.num_actions)
            loss, metrics = self.loss_fn(
                values,
                exp.values.to(dev),
                exp.returns.to(dev),
                action_mask=exp.action_mask.to(dev),
                dp_size=self.dist.world_size,
                batch_num_tokens=global_tokens,
                global_batch_size=global_seqs,
            )
            self.engine.backward(loss, scale_wrt_gas=False)
            self.engine.step()
            history.append({k: v.item() for k, v in metrics.items()})
        return optimizer_step_stats(self.engine, history, "critic")

    def save_checkpoint(self, path: str) -> None:
        """DeepSpeed states (weights, optimizer, scheduler) for --save_steps; every rank calls it."""
        save_engine_state(self.engine, path)

    def load_checkpoint(self, path: str) -> None:
        load_engine_state(self.engine, path)

    def save(self, path: str) -> None:
        if self.dist.rank == 0:
            self.engine.module.save(path)
