"""A reward model served as an actor (`--reward_pretrain DIR`): an HF sequence-classification model
with one output, scored on the full prompt + response text."""

from __future__ import annotations

import torch

from reinforce_pro.procs import capture_output
from reinforce_pro.workers.base import device


class RewardModelWorker:
    def __init__(self, model_path: str, micro_batch_size: int):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        capture_output("reward_model")
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=1, dtype=torch.float32)
        self.model.to(device()).eval()
        self.micro = micro_batch_size

    @torch.no_grad()
    def score(self, queries: list[str]) -> torch.Tensor:
        """(N,) float32 rewards, one per prompt + response text."""
        out = []
        for i in range(0, len(queries), self.micro):
            batch = self.tokenizer(queries[i : i + self.micro], return_tensors="pt", padding=True).to(device())
            out.append(self.model(**batch).logits[:, 0].float().cpu())
        return torch.cat(out)
