"""The critic: a transformer backbone with a scalar value head, as an nn.Module DeepSpeed can wrap.

`--critic_pretrain DIR` loads the backbone from an HF directory; if DIR also holds `value_head.safetensors`
(written by `save`), the head is restored, otherwise it starts at zero so the first values are 0.
The value of response token t is read at the position that predicts it (the state before acting),
aligned with the log-probs.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from reinforce_pro.models.logprobs import position_ids_from_mask
from reinforce_pro.models.packing import response_outputs
from reinforce_pro.models.varlen_attention import load_name

HEAD_FILE = "value_head.safetensors"


class ValueModel(nn.Module):
    def __init__(self, model_path: str, head_name: str = "score", attn_implementation: str = "sdpa", packed=False):
        """packed: padding-free forwards (--packing_samples)."""
        super().__init__()
        from safetensors.torch import load_file
        from transformers import AutoModel

        self.packed = packed
        self.backbone = AutoModel.from_pretrained(
            model_path, dtype=torch.float32, attn_implementation=load_name(attn_implementation, packed)
        )
        self.head_name = head_name
        head = nn.Linear(self.backbone.config.hidden_size, 1, bias=False)
        nn.init.zeros_(head.weight)
        self.add_module(head_name, head)
        head_file = Path(model_path) / HEAD_FILE
        if head_file.exists():
            head.load_state_dict({"weight": load_file(head_file)["weight"]})

    @property
    def head(self) -> nn.Linear:
        return getattr(self, self.head_name)

    def forward(self, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int) -> torch.Tensor:
        """(B, T) values of the response tokens."""
        if self.packed:
            hidden, real = response_outputs(self.backbone, sequences, attention_mask, num_actions)
            return self.head(hidden).squeeze(-1).float() * real
        hidden = self.backbone(
            input_ids=sequences,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state
        values = self.head(hidden).squeeze(-1).float()
        return values[:, -num_actions - 1 : -1]

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.backbone.gradient_checkpointing_enable(**kwargs)

    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        self.backbone.save_pretrained(path, safe_serialization=True)
        save_file({"weight": self.head.weight.detach().cpu().contiguous()}, str(Path(path) / HEAD_FILE))
