"""The settings a model-holding worker is built with: its place in the torch.distributed group (DistInfo), its
optimizer (OptimConfig) and how it loads its model and cuts its forwards (ForwardConfig). Plain dataclasses:
the run's config (run/config.py) holds them, the workers (workers/) read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from reinforce_pro.flagspec import flag

ROUTING_REPLAY = ("none", "r2", "r3")  # --routing_replay: whose routes the forwards replay (models/routing.py)
VERL_REPLAY_MODES = {"disabled": "none", "R2": "r2", "R3": "r3"}  # verl's router_replay.mode, accepted too


def replay_mode(given: str) -> str:
    """--routing_replay in reinforce_pro's spelling (verl's values read as ours)."""
    return VERL_REPLAY_MODES.get(given, given)


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
    # fmt: off
    adam_eps: float = flag(1e-08, "policy AdamW epsilon", flat=False, dotted="actor.adam.eps", group="optimizers")
    l2: float = flag(0.0, "AdamW weight decay", dotted="actor.adam.weight_decay", group="training")
    lr_scheduler: str = flag("cosine_with_min_lr", "transformers scheduler name", dotted="actor.lr_scheduler",
        group="training")
    lr_warmup_ratio: float = flag(0.03, "warm-up fraction of the LR schedule", dotted="actor.lr_warmup_ratio",
        group="training")
    min_lr_ratio: float = flag(0.1, "policy LR floor of cosine_with_min_lr, as a fraction of the LR", flat=False,
        dotted="actor.min_lr_ratio", group="optimizers")
    total_steps: int = 1  # optimizer steps over the whole run, for the scheduler
    max_norm: float = flag(1.0, "gradient clipping norm", dotted="actor.max_norm", group="training")
    zero_stage: int = flag(2, "ZeRO stage", dotted="ds.zero_stage", choices=(0, 1, 2, 3), group="deepspeed")
    param_dtype: str = "bf16"  # bf16 | fp16 | fp32
    adam_offload: bool = flag(False, "offload Adam states to host memory", dotted="ds.adam_offload", group="deepspeed")
    overlap_comm: bool = flag(False, "overlap ZeRO communication with compute", dotted="ds.overlap_comm",
        group="deepspeed")
    gradient_checkpointing: bool = flag(False, "recompute activations in backward",
        dotted="actor.gradient_checkpointing_enable", group="deepspeed")
    gradient_checkpointing_use_reentrant: bool = flag(False, "reentrant checkpointing",
        dotted="actor.gradient_checkpointing_reentrant", group="deepspeed")
    # fmt: on
    micro_batch_size: int = 4  # per rank per forward
    grad_accum_steps: int = 1  # micro-batches per optimizer step on each rank


@dataclass(frozen=True)
class ForwardConfig:
    """How a worker loads its model and cuts the forwards that score a rollout (policy, reference, critic)."""

    # fmt: off
    attn_implementation: str = flag("flash_attention_2",
        "HF attention kernel for trainer models; flash_attention_2 falls back to sdpa when flash-attn is not "
        "installed (always on CPU), with a notice", dotted="ds.attn_implementation", group="deepspeed")
    micro_batch_size: int = 8  # rows per scoring forward (--micro_rollout_batch_size)
    max_tokens: int | None = None  # --use_dynamic_batch: a token budget per forward instead
    packing_samples: bool = flag(False,
        "padding-free forwards: each micro-batch's sequences packed back to back in one row, positions restarting "
        "per sequence, attention within each (flash-attn varlen on GPU, sdpa per sequence on CPU; eager packs bins "
        "with a block-diagonal mask)",
        dotted="ds.packing_samples", group="deepspeed")
    ring_size: int = 1  # --ring_attn_size: the policy's rows split along the sequence over rings of ranks
    # whose routes the forwards replay: models/routing.py
    routing_replay: str = flag("none",
        "[reinforce_pro] MoE models: the experts the trainer's forwards use. r3: the engine's, recorded for every "
        "sampled token (rollout routing replay, arXiv 2510.11370); r2: the old policy's, from the forward that "
        "computes the old log-probs; none: the trainer routes itself. routing/* measures the disagreement either "
        "way. verl's values (actor_rollout_ref.actor.router_replay.mode) disabled / R2 / R3 are accepted",
        choices=ROUTING_REPLAY, convert=replay_mode, group="training")
    fp32_lm_head: bool = flag(False,
        "[reinforce_pro] the LM head's matmul in float32 on both sides: the trainer's models (policy, reference, "
        "teacher) cast the last hidden states and the head's weight to fp32, the engines get vLLM's "
        "hf_overrides head_dtype float32, which does the same (TRL's cast_lm_head_to_fp32 is accepted). Changes "
        "nothing where both sides already run in fp32", also="--cast_lm_head_to_fp32", group="deepspeed")
    experts_implementation: str | None = flag(None,
        "MoE expert kernels of the trainer's models (transformers' experts_implementation; unset: its default): "
        "eager, batched_mm, grouped_mm (the last where torch has grouped_mm); deepgemm needs CUDA and DeepGEMM",
        flat=False, dotted="ds.experts_implementation", choices=("eager", "batched_mm", "grouped_mm", "deepgemm"),
        group="deepspeed")
    # fmt: on

    def model_kwargs(self) -> dict:
        """from_pretrained keywords for the expert kernels, when set (an MoE model's; a dense one has none)."""
        return {"experts_implementation": self.experts_implementation} if self.experts_implementation else {}
