"""LoRA on the policy (--lora_rank, --lora_alpha, --target_modules, --lora_dropout; OpenRLHF's flags), with peft.

The trainer holds a peft model: frozen base weights plus low-rank A, B per target linear layer, of which only
A and B train. The rollout engines never see the adapter: every weight sync sends the *merged* weights
W + (alpha / r) * B @ A under the base model's own parameter names (`merged_state_dict`), so an engine serves
the policy exactly as a fully fine-tuned model and the engine-vs-trainer log-prob parity is the same check as
without LoRA. (vLLM can also serve LoRA adapters; merged weights keep one sync path for every engine build,
and the CPU build's LoRA support is not relied on.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LoraSettings:
    rank: int  # r; 0 never reaches here (full fine-tuning)
    alpha: int = 16  # the update is scaled by alpha / rank
    target_modules: list[str] | str = "all-linear"  # peft's names, or "all-linear" (not lm_head)
    dropout: float = 0.0


def apply_lora(model: torch.nn.Module, lora: LoraSettings) -> torch.nn.Module:
    """`model` wrapped as a peft model whose only trainable parameters are the LoRA A / B matrices (B starts
    at zero, so the wrapped model computes exactly what `model` did)."""
    from peft import LoraConfig, get_peft_model

    targets = lora.target_modules
    if targets == ["all-linear"]:
        # peft's keyword is the string; any other single string would be read as a regex over full module
        # names, so `--target_modules q_proj` stays a list
        targets = "all-linear"
    config = LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, target_modules=targets, lora_dropout=lora.dropout, bias="none",
        task_type="CAUSAL_LM",
    )  # fmt: skip
    return get_peft_model(model, config)


def is_lora(model: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """fp32 CPU copies of the weights under the base model's names, LoRA deltas merged in; a model without
    LoRA gives its own state dict. The model's parameters are not modified (no merge / unmerge round trip,
    which would leave float error in the frozen weights). Under ZeRO-3 call it with the parameters gathered.

    Every tensor is copied, so tied weights (embed_tokens / lm_head) become two tensors: safetensors refuses
    aliases, and vLLM wants both names."""
    if not is_lora(model):
        return {name: _cpu_fp32(t) for name, t in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {
        f"{name}.weight": sum(module.get_delta_weight(adapter) for adapter in module.active_adapters)
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer)
    }
    merged = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        merged[name] = _cpu_fp32(tensor)
        if name in deltas:
            merged[name] += _cpu_fp32(deltas[name])
    return merged


def _cpu_fp32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float32, copy=True).contiguous()


def trainable_summary(model: torch.nn.Module) -> str:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return f"{trainable:,} of {total:,} parameters trainable ({100 * trainable / max(total, 1):.2f}%)"
