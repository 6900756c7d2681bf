"""LoRA on the policy (--lora_rank, --lora_alpha, --target_modules, --lora_dropout; OpenRLHF's flags), with peft.

The trainer holds a peft model: frozen base weights plus low-rank A, B per target linear layer, of which only
A and B train. The rollout engines never see the adapter: every weight sync sends the *merged* weights
W + (alpha / r) * B @ A under the base model's own parameter names (`merged_state_dict`), so an engine serves
the policy exactly as a fully fine-tuned model and the engine-vs-trainer log-prob parity is the same check as
without LoRA. (vLLM can also serve LoRA adapters; merged weights keep one sync path for every engine build,
and the CPU build's LoRA support is not relied on.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class LoraAdapterConfig:
    rank: int  # r; 0 never reaches here (full fine-tuning)
    alpha: int = 16  # the update is scaled by alpha / rank
    target_modules: list[str] | str = "all-linear"  # peft's names, or "all-linear" (not lm_head)
    dropout: float = 0.0


def apply_lora(model: torch.nn.Module, lora: LoraAdapterConfig) -> torch.nn.Module:
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
    which would leave float error in the frozen weights). Under ZeRO-3 call it with the parameters gathered,
    or use `merged_weights` with a gather.

    Every tensor is copied, so tied weights (embed_tokens / lm_head) become two tensors: safetensors refuses
    aliases, and vLLM wants both names."""
    return {name: _cpu_fp32(t) for name, t in merged_weights(model)}


def weight_blocks(keys: list[str]) -> list[list[str]]:
    """State-dict keys grouped into the units gathered together under ZeRO-3: one transformer layer (the keys
    up to the first numbered path component, `model.layers.3`), or one other module with its LoRA parts."""
    blocks: dict[str, list[str]] = {}
    for key in keys:
        parts = key.split(".")
        numbered = next((i for i, part in enumerate(parts) if part.isdigit()), None)
        if numbered is not None:
            block = ".".join(parts[: numbered + 1])
        else:
            block = key.split(".base_layer.")[0].split(".lora_")[0]
        blocks.setdefault(block, []).append(key)
    return list(blocks.values())


def merged_weights(model: torch.nn.Module, gather=None, skip_tied: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every weight under the base model's names, LoRA deltas merged in (as fp32), one
    block (`weight_blocks`) at a time. `gather(params)`: a context manager that materialises those parameters
    (ZeRO-3's GatheredParameters), so at most one layer is whole at once; None when they are whole already.
    `skip_tied`: a parameter under a second name (a tied LM head: `lm_head.weight` is `embed_tokens.weight`)
    only under its first, as a weight sync sends it: vLLM's loader skips a tied head's weight, so it would
    travel for nothing (SmolLM2: 113 of 651 MB). A yielded tensor is valid until the next one is asked for:
    copy it before."""
    base = model.get_base_model() if is_lora(model) else model
    state = base.state_dict(keep_vars=True)
    seen: set[int] = set()
    lora_layers = {}
    if is_lora(model):
        from peft.tuners.lora import LoraLayer

        lora_layers = {f"{name}.weight": m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    for block in weight_blocks(list(state)):
        keys = [k for k in block if ".lora_" not in k and not (skip_tied and id(state[k]) in seen)]
        if not keys:  # nothing to yield: no gather either (a rank that stops reading after the last weight
            continue  # must not leave the others waiting in a ZeRO-3 gather of a block with nothing in it)
        seen.update(id(state[k]) for k in keys)
        params = list({id(t): t for k in block if isinstance(t := state[k], torch.nn.Parameter)}.values())
        with gather(params) if gather is not None and params else contextlib.nullcontext():
            for key in keys:
                name = key.replace(".base_layer.", ".")
                tensor = state[key].detach()
                layer = lora_layers.get(name)
                if layer is not None:
                    delta = sum(layer.get_delta_weight(adapter) for adapter in layer.active_adapters)
                    tensor = tensor.float() + delta.float()
                yield name, tensor


def _cpu_fp32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float32, copy=True).contiguous()


def trainable_summary(model: torch.nn.Module) -> str:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return f"{trainable:,} of {total:,} parameters trainable ({100 * trainable / max(total, 1):.2f}%)"
