"""The policy: a DeepSpeed-wrapped causal LM that computes old log-probs, trains with PolicyLoss
(IS correction included) and hands its weights to the rollout engines. With --lora_rank it trains LoRA
adapters only and hands the engines merged weights (models/lora.py)."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from reinforce_pro.algos.kl import KL_ESTIMATORS, kl_loss
from reinforce_pro.algos.losses import PolicyLoss, SurrogateConfig
from reinforce_pro.algos.masked import aggregate_loss
from reinforce_pro.algos.stats import Stat, loss_stat
from reinforce_pro.experience import Experience, pad_actions
from reinforce_pro.flagspec import flag
from reinforce_pro.models import varlen_attention
from reinforce_pro.models.fp32_head import install_fp32_head
from reinforce_pro.models.logprobs import response_log_probs
from reinforce_pro.models.lora import (
    LoraAdapterConfig,
    apply_lora,
    is_lora,
    merged_state_dict,
    merged_weights,
    trainable_summary,
)
from reinforce_pro.models.ring_attention import join_rings, register, ring_response_log_probs
from reinforce_pro.models.routing import RouteReplay, RoutingPass, moe_shape, replay_routes
from reinforce_pro.models.sampling_filter import SamplingFilter, with_engine_stop_ids
from reinforce_pro.procs import capture_output, use_host_threads
from reinforce_pro.rollout.collective import TensorInfo, WeightGroupSpec, device_for, open_group, send
from reinforce_pro.workers.base import (
    batched_log_probs,
    device,
    initialize_deepspeed,
    load_engine_state,
    optimizer_step_stats,
    save_engine_state,
    setup_distributed,
)
from reinforce_pro.workers.configs import DistInfo, ForwardConfig, OptimConfig


@dataclass
class PolicyLossConfig:
    """The policy worker's loss: the surrogate with its IS correction (SurrogateConfig, handed to PolicyLoss as
    is), and the terms the worker adds to it."""

    surrogate: SurrogateConfig = field(default_factory=SurrogateConfig)
    # fmt: off
    # its coefficient comes with each mini-batch: the trainer's KL controller owns it
    use_kl_loss: bool = flag(False, "KL as a loss term instead of a reward penalty", dotted="algo.kl.use_loss",
        group="training")
    kl_estimator: str = flag("k1", "KL estimator", dotted="algo.kl.estimator", choices=KL_ESTIMATORS, group="training")
    entropy_loss_coef: float | None = flag(None, "entropy bonus coefficient", dotted="actor.entropy_coef",
        group="training")
    temperature: float = 1.0
    # the reverse KL's own gradient (algos/kl.kl_loss)
    kl_unbiased_gradient: bool = flag(False,
        "OpenRLHF 0.11.2, with --use_kl_loss: keep the estimator's value, give the loss the reverse KL's own gradient, "
        "importance-weighted by pi / pi_old (at most 10) for the epochs after the first; k1, k2, k3 then share it",
        dotted="algo.kl.unbiased_gradient", group="training")
    # the engine's top-k / top-p / minimum length, replayed on the trainer's logits (models/sampling_filter.py)
    sampling_filter: SamplingFilter | None = None
    # the router's load-balancing loss (models/routing.py)
    aux_loss_coef: float = flag(0,
        "MoE models: weight of the router's load-balancing loss (Switch Transformer's, as transformers computes "
        "it: the number of experts per token when balanced) in the policy loss; logged as policy/aux_loss",
        dotted="actor.aux_loss_coef", at_least=0, finite=True, group="training")
    # fmt: on


class PolicyWorker:
    """One data-parallel rank of the policy. Wrapped with ray.remote by the launcher."""

    def __init__(
        self, model_path: str, opt: OptimConfig, loss: PolicyLossConfig, dist: DistInfo, seed: int,
        forward: ForwardConfig, lora: LoraAdapterConfig | None = None,
    ):  # fmt: skip
        """forward: the attention kernel and how the forwards that score a rollout are cut; lora: train LoRA
        adapters on the frozen pretrained weights instead of every weight."""
        from transformers import AutoModelForCausalLM

        capture_output(f"policy_rank{dist.rank}")
        setup_distributed(dist)
        torch.manual_seed(seed + dist.rank)
        loss = replace(loss, sampling_filter=with_engine_stop_ids(loss.sampling_filter, model_path))
        self.model_path, self.opt, self.loss_cfg, self.dist = model_path, opt, loss, dist
        self.forward = forward
        attn = varlen_attention.load_name(forward.attn_implementation, forward.packing_samples)
        if forward.ring_size > 1:  # --ring_attn_size: attention over rows split along the sequence (ring_attention.py)
            register()
            attn = "ring"
        model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.float32, attn_implementation=attn, **forward.model_kwargs()
        )
        if forward.fp32_lm_head:  # before DeepSpeed casts the weights: the head computes in fp32 whatever they are
            install_fp32_head(model)
        # MoE: every forward's routing is measured, replayed under --routing_replay, and feeds the balance loss
        self.replay = RouteReplay.install(model) if moe_shape(model) else None
        if self.replay is not None:
            self.replay.keep_probs = loss.aux_loss_coef > 0
        if lora is not None:
            model = apply_lora(model, lora)
            if dist.rank == 0:
                print(f"[lora] rank {lora.rank}, alpha {lora.alpha}: {trainable_summary(model)}", flush=True)
        self.engine = initialize_deepspeed(model, opt, dist.world_size)
        self.loss_fn = PolicyLoss(loss.surrogate)
        self.ring = join_rings(dist.rank, dist.world_size, forward.ring_size) if forward.ring_size > 1 else None
        if self.replay is not None:
            self.replay.ring = self.ring  # a ring forward's routers see one block of each row (RingLayout)

    def response_log_probs(self, model, sequences, attention_mask, num_actions, temperature, with_entropy=False,
                           packed=False, sampling_filter=None, outside=None):  # fmt: skip
        """models.logprobs.response_log_probs, or under --ring_attn_size the ring's (every rank of the ring
        gets the whole (B, T); its ranks were given the same rows; it reports no `outside` flags)."""
        if self.ring is None:
            return response_log_probs(
                model, sequences, attention_mask, num_actions, temperature, with_entropy, packed, sampling_filter,
                outside,
            )  # fmt: skip
        ring = self.ring
        return ring_response_log_probs(
            model, sequences, attention_mask, num_actions, ring.rank, ring.ranks, ring.group, temperature, with_entropy,
            sampling_filter,
        )  # fmt: skip

    def log_probs(self, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int) -> torch.Tensor:
        """(B, T) log-probs of the response tokens under the current weights (the "old" policy)."""
        return self.log_probs_and_outside(sequences, attention_mask, num_actions)[:, 0]

    def log_probs_and_outside(self, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int):
        """(B, 2, T): score()'s log-probs and outside flags, stacked."""
        scored = self.score(sequences, attention_mask, num_actions)
        return torch.stack([scored["log_probs"], scored["outside"]], dim=1)

    def score(
        self, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, routes=None, force=None
    ) -> dict:
        """The old forward over a rollout: {"log_probs": (B, T), "outside": (B, T), 1 on each sampled token
        that the trainer's replay of the engine's sampling filter would have removed (else 0; the two sides'
        filters disagreed there, as a bf16 engine's logits near a top-p or top-k boundary make them:
        models/sampling_filter.py), NaN where nothing was replayed (no filter, or the ring's forward)}. An MoE
        policy adds RoutingPass.result()'s "flips" against `routes` (B, S, L, K), the engine's, which it
        replays under --routing_replay r3 (`force` False: routes itself all the same), and "own_routes", which
        R2 replays in the training forward."""
        self.engine.eval()
        fwd, outside = self.forward, []
        routing = None
        if self.replay is not None:
            routing = RoutingPass(self.replay, routes, force=fwd.routing_replay == "r3" if force is None else force)
        lp = batched_log_probs(
            self.engine, sequences, attention_mask, num_actions, self.loss_cfg.temperature, fwd.micro_batch_size,
            fwd.max_tokens, fwd.packing_samples, self.response_log_probs, self.loss_cfg.sampling_filter, outside,
            routing,
        )  # fmt: skip
        scored = {"log_probs": lp, "outside": outside[0] if outside else torch.full_like(lp, float("nan"))}
        return {**scored, **(routing.result() if routing is not None else {})}

    def score_unreplayed(self, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, routes):
        """score()'s log-probs with the trainer's own routing under --routing_replay r3: what the old forward
        would have computed without replay (the gap replay closes: routing/logprob_abs_diff_unreplayed_mean)."""
        return {"log_probs": self.score(sequences, attention_mask, num_actions, routes, force=False)["log_probs"]}

    def train_minibatch(
        self, micro_batches: list[Experience], global_tokens: float, global_seqs: float, kl_coef: float = 0.0
    ) -> tuple[dict[str, Stat], torch.Tensor | None]:
        """One optimizer step over this rank's micro-batches of a global mini-batch: (metrics, the detached
        training log-probs (B, T) of these rows when the micro-batches carry no old log-probs, else None).

        `global_tokens` / `global_seqs` count the action tokens / sequences of the whole mini-batch over
        all ranks, so that aggregate_loss gives the same gradient however the batch is sharded. `kl_coef`:
        the coefficient of the --use_kl_loss term this step (the trainer's KL controller). Without old
        log-probs (one epoch, one mini-batch: PPOTrainer.old_log_probs_needed) the training forward's own
        log-probs, detached, are the old ones: the weights have not moved since the rollout was scored.
        """
        self.engine.train()
        history, log_probs = [], []
        for i, exp in enumerate(micro_batches):
            # the optimizer steps after the last micro-batch, however many there are (self-play varies it)
            self.engine.set_gradient_accumulation_boundary(i == len(micro_batches) - 1)
            stats, lp = self._micro_step(exp, global_tokens, global_seqs, kl_coef, len(micro_batches))
            history.append(stats)
            log_probs.append(lp)
        old = torch.cat(log_probs).float().cpu() if micro_batches[0].old_log_probs is None else None
        return optimizer_step_stats(self.engine, history, "policy"), old

    def _micro_step(
        self, exp: Experience, global_tokens: float, global_seqs: float, kl_coef: float, micro_batches: int
    ) -> tuple[dict[str, Stat], torch.Tensor]:
        dev, cfg, num_actions = device(), self.loss_cfg, exp.num_actions
        exp = exp.trim_padding()
        seq, mask, action_mask = exp.sequences.to(dev), exp.attention_mask.to(dev), exp.action_mask.to(dev)
        want_entropy = cfg.entropy_loss_coef is not None
        self._route(exp, mask)
        log_probs, entropy = self.response_log_probs(
            self.engine, seq, mask, exp.num_actions, cfg.temperature, want_entropy, self.forward.packing_samples,
            cfg.sampling_filter,
        )  # fmt: skip
        old_log_probs = log_probs.detach() if exp.old_log_probs is None else exp.old_log_probs.to(dev)
        agg = dict(dp_size=self.dist.world_size, batch_num_tokens=global_tokens, global_batch_size=global_seqs)
        loss, metrics = self.loss_fn(
            log_probs,
            old_log_probs,
            exp.advantages.to(dev),
            action_mask=action_mask,
            rollout_log_probs=exp.rollout_log_probs.to(dev),
            **agg,
        )
        level = self.loss_fn.token_level_loss
        metrics["policy/pg_loss"] = loss_stat(loss, action_mask, level, **agg)
        if cfg.use_kl_loss:
            kl, kl_metrics = kl_loss(
                cfg.kl_estimator, log_probs, exp.ref_log_probs.to(dev), action_mask, kl_coef, level, **agg,
                old_log_probs=old_log_probs, unbiased_gradient=cfg.kl_unbiased_gradient,
            )  # fmt: skip
            loss = loss + kl
            metrics.update(kl_metrics)
        if self.replay is not None and cfg.aux_loss_coef > 0:
            balance = self.replay.balance_loss()
            # the mean over this step's micro-batches; DeepSpeed averages the ranks' gradients (OpenRLHF's scale)
            loss = loss + cfg.aux_loss_coef * balance / micro_batches
            metrics["policy/aux_loss"] = Stat(balance.detach())
        if want_entropy:
            ent = aggregate_loss(entropy, action_mask, level, **agg)
            loss = loss - cfg.entropy_loss_coef * ent
            metrics["policy/entropy"] = loss_stat(ent, action_mask, level, **agg)
        # aggregate_loss already divides by the global counts: DeepSpeed must not divide again by the
        # number of accumulation steps.
        self.engine.backward(loss, scale_wrt_gas=False)
        self.engine.step()
        return {k: v.item() for k, v in metrics.items()}, pad_actions(log_probs.detach(), num_actions)

    def _route(self, exp: Experience, mask: torch.Tensor) -> None:
        """Before a training forward of an MoE policy: replay the routes the experience carries (the engine's
        under --routing_replay r3, the old forward's under r2), or let it route itself."""
        if self.replay is None:
            return
        layout = self.replay.layout(self.engine, mask) if self.forward.packing_samples else None
        replay_routes(self.replay, exp.routes, mask, True, layout)

    def save_checkpoint(self, path: str) -> None:
        """DeepSpeed states (weights, optimizer, scheduler) for --save_steps; every rank calls it."""
        save_engine_state(self.engine, path)

    def load_checkpoint(self, path: str) -> None:
        load_engine_state(self.engine, path)

    def state_dict_bytes(self, dtype: str = "float32") -> bytes | None:
        """The HF state dict as safetensors bytes in `dtype` (the engines' dtype), from rank 0; every rank
        must call it (ZeRO-3 shards are gathered first, layer by layer)."""
        from safetensors.torch import save

        if self.dist.rank != 0:
            self._join_gathers()
            return None
        target = getattr(torch, dtype)
        return save({name: t.to("cpu", target, copy=True).contiguous() for name, t in self._weights()})

    # Collective weight sync (--vllm_sync_backend gloo|nccl, rollout/collective.py): rank 0 joins a process
    # group with every engine worker; every rank walks the weights (ZeRO-3 gathers are collective), rank 0
    # broadcasts them.

    def weight_manifest(self, dtype: str) -> list[TensorInfo] | None:
        """Name, shape and `dtype` of every weight a sync sends, in order (rank 0; every rank must call it)."""
        manifest = [TensorInfo(name, tuple(t.shape), dtype) for name, t in self._weights()]
        return manifest if self.dist.rank == 0 else None

    def join_weight_group(self, spec: WeightGroupSpec, host: str) -> None:
        """Rank 0 joins as rank 0 of the weight group (blocks until the engines have joined too)."""
        if self.dist.rank == 0:
            self.weight_group = None  # the previous group, if any
            self.weight_group = open_group(spec, 0, host)
            self.weight_device = device_for(spec.backend)

    def broadcast_weights(self, manifest: list[TensorInfo] | None, bucket_bytes: int) -> int:
        """Broadcast the current weights to the group (rank 0) bucket by bucket; returns bytes sent (0 on the
        other ranks, which only take part in the ZeRO-3 gathers)."""
        if self.dist.rank != 0:
            self._join_gathers()
            return 0
        return send(self.weight_group, self._weights(), manifest, bucket_bytes, self.weight_device)

    def _join_gathers(self) -> None:
        """What a rank other than 0 does during a sync: walk the weights without copying them, so that
        ZeRO-3's collective gathers pair up with rank 0's (a cheap loop below stage 3)."""
        for _ in self._weights():
            pass

    def _weights(self):
        """merged_weights of the model as a sync sends them (a tied LM head once, under the embedding's name),
        ZeRO-3 shards gathered one block (layer) at a time."""
        gather = None
        if self.opt.zero_stage == 3:
            import deepspeed

            gather = lambda params: deepspeed.zero.GatheredParameters(params, modifier_rank=None)  # noqa: E731
        return merged_weights(self.engine.module, gather, skip_tied=True)

    @contextmanager
    def _gathered(self):
        """The whole model on this rank for the duration (ZeRO-3 shards gathered; a no-op below stage 3)."""
        if self.opt.zero_stage != 3:
            yield self.engine.module
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()), modifier_rank=None):
            yield self.engine.module

    def save_hf(self, path: str, merged: bool = False) -> str | None:
        """Save the current policy as an HF model directory (weights, config, tokenizer); rank 0 writes.
        With LoRA: the adapter (adapter_config.json + adapter_model.safetensors, peft's format), or with
        `merged` the base model with the adapter merged in, an ordinary model directory."""
        with self._gathered() as module:
            lora = is_lora(module) and not merged
            state = None if lora else merged_state_dict(module)
            if self.dist.rank != 0:
                return None
            out = Path(path)
            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            if lora:
                module.save_pretrained(tmp, safe_serialization=True)  # peft writes the adapter only
            else:
                base = module.get_base_model() if is_lora(module) else module
                base.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        for f in Path(self.model_path).iterdir():  # tokenizer files travel with the weights
            if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")):
                shutil.copy2(f, tmp / f.name)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)  # write, then rename: a crash never leaves a half-written model at `path`
        return str(out)

    def parameter_checksum(self) -> float:
        """Sum of |w| over all parameters: lets tests see that training changed the weights."""
        return float(sum(t.float().abs().sum() for _, t in self._weights()))


class ReferenceWorker:
    """The frozen reference policy for the KL term: an HF model in eval mode, no optimizer."""

    def __init__(
        self, model_path: str, temperature: float, param_dtype: str, forward: ForwardConfig,
        sampling_filter: SamplingFilter | None = None, role: str = "reference",
    ):  # fmt: skip
        """sampling_filter: the engine's filters, replayed as the policy replays them, so that the KL to the
        reference compares two distributions over the same kind of support. role: its log file's name (a
        distillation teacher is this worker too: a frozen model that scores given tokens)."""
        from transformers import AutoModelForCausalLM

        capture_output(f"{role}_pid{os.getpid()}")
        use_host_threads()
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(param_dtype, torch.float32)
        attn = varlen_attention.load_name(forward.attn_implementation, forward.packing_samples)
        model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=dtype, attn_implementation=attn, **forward.model_kwargs()
        )
        if forward.fp32_lm_head:
            install_fp32_head(model)
        self.model = model.to(device()).eval()
        self.forward, self.temperature = forward, temperature
        self.sampling_filter = with_engine_stop_ids(sampling_filter, model_path)
        self.replay = RouteReplay.install(model) if moe_shape(model) else None

    def log_probs(
        self, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, routes=None
    ) -> torch.Tensor:
        """(B, T) log-probs under the reference; an MoE reference replays `routes` (B, S, L, K) when given (the
        engine's, under --routing_replay r3), else routes itself."""
        fwd = self.forward
        routing = RoutingPass(self.replay, routes) if self.replay is not None else None
        return batched_log_probs(
            self.model, sequences, attention_mask, num_actions, self.temperature, fwd.micro_batch_size,
            fwd.max_tokens, fwd.packing_samples, sampling_filter=self.sampling_filter, routing=routing,
        )  # fmt: skip
