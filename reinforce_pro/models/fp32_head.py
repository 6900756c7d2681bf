"""An fp32 LM head on a model of lower precision (`--fp32_lm_head`): the head's matmul takes the last hidden
states and the head's weight cast to float32, as vLLM's `hf_overrides={"head_dtype": "float32"}` computes it in
the engine (its LogitsProcessor: `F.linear(hidden.to(fp32), weight.to(fp32))`; the weight stays stored in the
model's dtype on both sides). The flag sets both sides at once: an fp32 head on one side only widens the gap."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reinforce_pro.models.packing import hf_model


class HeadNotOverridable(ValueError):
    """The model's output layer is not a plain linear head (vLLM's override applies to unquantized heads only)."""


def install_fp32_head(model) -> torch.nn.Module:
    """Make the output layer of `model` (an HF causal LM, or a PEFT model wrapping one) compute in float32
    whatever dtype its weight is cast to later (DeepSpeed casts after this): the logits come out float32. Returns
    the head."""
    head = hf_model(model).get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise HeadNotOverridable(f"--fp32_lm_head: the output layer is {type(head).__name__}, not a linear head")

    def fp32_forward(hidden: torch.Tensor) -> torch.Tensor:
        bias = head.bias.float() if head.bias is not None else None
        return F.linear(hidden.float(), head.weight.float(), bias)

    head.forward = fp32_forward  # an instance attribute: nn.Module.__call__ finds it before the class's forward
    return head
