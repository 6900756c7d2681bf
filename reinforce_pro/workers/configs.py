"""The settings a model-holding worker is built with: its place in the torch.distributed group (DistInfo), its
optimizer (OptimConfig) and how it loads its model and cuts its forwards (ForwardConfig). Plain dataclasses:
the run's config (run/config.py) holds them, the workers (workers/) read them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    # "file:///tmp/..." for a group on one host: the rendezvous needs no TCP listener (torch's TCPStore binds
    # every interface whatever MASTER_ADDR says); None: env:// through MASTER_ADDR / MASTER_PORT.
    init_method: str | None = None


@dataclass
class OptimConfig:
    learning_rate: float  # no default: the flags differ (--actor_learning_rate 1e-6, --critic_learning_rate 9e-6)
    adam_betas: tuple[float, float] = (0.9, 0.95)
    adam_eps: float = 1e-8
    l2: float = 0.0
    lr_scheduler: str = "cosine_with_min_lr"
    lr_warmup_ratio: float = 0.03
    min_lr_ratio: float = 0.1  # cosine_with_min_lr decays to this fraction of learning_rate
    total_steps: int = 1  # optimizer steps over the whole run, for the scheduler
    max_norm: float = 1.0
    zero_stage: int = 2
    param_dtype: str = "bf16"  # bf16 | fp16 | fp32
    adam_offload: bool = False
    overlap_comm: bool = False
    gradient_checkpointing: bool = False
    gradient_checkpointing_use_reentrant: bool = False
    micro_batch_size: int = 4  # per rank per forward
    grad_accum_steps: int = 1  # micro-batches per optimizer step on each rank


@dataclass(frozen=True)
class ForwardConfig:
    """How a worker loads its model and cuts the forwards that score a rollout (policy, reference, critic)."""

    attn_implementation: str  # HF's attn_implementation (the run resolves flash_attention_2 to what is installed)
    micro_batch_size: int  # rows per scoring forward (--micro_rollout_batch_size)
    max_tokens: int | None = None  # --use_dynamic_batch: a token budget per forward instead
    packing_samples: bool = False  # padding-free forwards
    ring_size: int = 1  # --ring_attn_size: the policy's rows split along the sequence over rings of ranks
    routing_replay: str = "none"  # --routing_replay, MoE models: whose routes the forwards replay (models/routing.py)
    experts_implementation: str | None = None  # MoE models: transformers' expert kernels (None: its default)

    def model_kwargs(self) -> dict:
        """from_pretrained keywords for the expert kernels, when set (an MoE model's; a dense one has none)."""
        return {"experts_implementation": self.experts_implementation} if self.experts_implementation else {}
