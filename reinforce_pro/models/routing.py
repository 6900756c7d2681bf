"""Mixture-of-experts routing in the trainer's forwards: measure it, replay it, and its load-balancing loss.

A router picks each token's top-k experts per layer. The rollout engine and the trainer compute the router's
logits in different kernels and dtypes, so a token whose k-th and (k+1)-th experts are close can go to different
experts on the two sides: its hidden state, and through attention every later position's, then differ far more
than rounding explains. Rollout routing replay (R3, Ma et al. 2025, arXiv 2510.11370) makes the trainer use the
experts the engine used; the router's weights over them are still the trainer's own softmax, so the router keeps
its gradient. R2 replays the old policy's own routes in the training forward instead.

`RouteReplay` hooks every router of an HF model once (persistent hooks: gradient checkpointing re-runs a layer's
forward during the backward, and must see the same routes). Before each forward, `use(routes, real)` says what the
next forwards replay: `routes` (N, L, K) holds the top-k expert ids of each of the N tokens the forward flattens
(rows times columns for a padded batch, the packed order for a packed one), per MoE layer; -1 on a token leaves
it to the trainer's own router. Each forward records, per layer, the tokens whose own top-k set differs from the
given one (`flips`), its own routes (`own`, for R2), and the router softmax and expert counts the load-balancing
loss needs.

Routers are read by their output: HF's MoE routers (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE in transformers 5)
return (router_logits, top-k weights, top-k indices) from the flattened hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

ROUTING_REPLAY = ("none", "r2", "r3")  # --routing_replay
# Routers whose top-k weights are renormalised over the chosen experts whatever their config says
ALWAYS_RENORMALISED = ("MixtralTopKRouter",)


class RoutingDataError(ValueError):
    """Routes that cannot be replayed on this model (wrong shape, an expert id out of range)."""


def moe_routers(model) -> list[torch.nn.Module]:
    """The router of each MoE layer of an HF causal LM (a DeepSpeed engine's or PEFT model's inner model
    included), in layer order; [] for a dense model. A router is a module with `top_k` and `num_experts` and a
    2-D `weight` of (experts, hidden)."""
    from reinforce_pro.models.packing import hf_model

    return [
        m
        for m in hf_model(model).modules()
        if hasattr(m, "top_k") and hasattr(m, "num_experts") and getattr(m, "weight", None) is not None
        and m.weight.dim() == 2 and m.weight.size(0) == m.num_experts
    ]  # fmt: skip


def moe_shape(model) -> tuple[int, int, int] | None:
    """(MoE layers, experts, experts per token) of `model`, or None for a dense model."""
    routers = moe_routers(model)
    if not routers:
        return None
    return len(routers), int(routers[0].num_experts), int(routers[0].top_k)


def check_routes(routes: torch.Tensor, layers: int, experts: int, top_k: int, tokens: int | None = None) -> None:
    """Refuse, in one line, routes this model cannot replay."""
    want = f"(tokens, {layers} MoE layers, top-{top_k})"
    if routes.dim() != 3 or tuple(routes.shape[1:]) != (layers, top_k):
        raise RoutingDataError(f"routes of shape {tuple(routes.shape)} cannot be replayed: this model takes {want}")
    if tokens is not None and routes.size(0) != tokens:
        raise RoutingDataError(f"routes for {routes.size(0)} tokens given to a forward of {tokens} tokens")
    if routes.is_floating_point():
        raise RoutingDataError(f"routes must be integer expert ids, got {routes.dtype}")
    bad = (routes < -1) | (routes >= experts)
    if bad.any():
        raise RoutingDataError(
            f"expert id {int(routes[bad][0])} out of range: this model has {experts} experts (ids 0..{experts - 1};"
            " -1: the trainer's own routing)"
        )
    given = routes >= 0
    if (given.any(-1) & ~given.all(-1)).any():
        raise RoutingDataError("a token's routes give some of its top-k experts and not others: give all k or -1s")


@dataclass
class LayerRecord:
    """What one router saw in the last forward (N tokens of the flattened batch)."""

    own: torch.Tensor  # (N, K) long, the trainer's own top-k
    flipped: torch.Tensor | None  # (N,) bool, own top-k set != the replayed one (None: nothing replayed)
    probs: torch.Tensor  # (N, E) float32, the router's softmax (differentiable: the load-balancing loss)
    used: torch.Tensor  # (N, K) long, the experts the layer computed with


@dataclass
class RouteReplay:
    """Hooks on every router of a model: replays given routes and records each forward's routing."""

    routers: list[torch.nn.Module]
    experts: int
    top_k: int
    routes: torch.Tensor | None = None  # (N, L, K) for the next forwards, or None: the trainer's own routing
    real: torch.Tensor | None = None  # (N,) bool, the tokens that are not padding (the load-balancing loss)
    records: dict[int, LayerRecord] = field(default_factory=dict)  # layer -> what it saw in the last forward
    keep_probs: bool = False  # record the softmax with its graph (only when the load-balancing loss is wanted)

    @classmethod
    def install(cls, model) -> RouteReplay:
        """Hook every router of `model` (an MoE model; see moe_routers)."""
        routers = moe_routers(model)
        if not routers:
            raise RoutingDataError("routing replay needs a mixture-of-experts model; this one has no router")
        replay = cls(routers, int(routers[0].num_experts), int(routers[0].top_k))
        for layer, router in enumerate(routers):
            router.register_forward_hook(replay._hook(layer))
        return replay

    @property
    def layers(self) -> int:
        return len(self.routers)

    def use(self, routes: torch.Tensor | None, real: torch.Tensor | None = None) -> None:
        """Replay `routes` (N, L, K; -1: own routing) in the forwards that follow, or None: route as trained.
        `real`: (N,) which tokens are not padding. Clears what earlier forwards recorded."""
        if routes is not None:
            check_routes(routes, self.layers, self.experts, self.top_k)
        self.routes, self.real, self.records = routes, real, {}

    def _hook(self, layer: int):
        def hook(module, args, output):
            logits, weights, own = output
            tokens = logits.size(0)
            probs = torch.softmax(logits.float(), dim=-1)
            given = None
            if self.routes is not None:
                if self.routes.size(0) != tokens:
                    raise RoutingDataError(f"routes for {self.routes.size(0)} tokens given to a forward of {tokens}")
                given = self.routes[:, layer].to(own.device, torch.long)
            used, flipped = own, None
            if given is not None:
                forced = given[:, 0] >= 0
                used = torch.where(forced.unsqueeze(-1), given, own)
                flipped = forced & (own.sort(-1).values != given.sort(-1).values).any(-1)
            self.records[layer] = LayerRecord(
                own.detach(), flipped, probs if self.keep_probs else probs.detach(), used.detach()
            )
            if given is None:
                return output
            chosen = probs.gather(-1, used)
            if getattr(module, "norm_topk_prob", False) or type(module).__name__ in ALWAYS_RENORMALISED:
                chosen = chosen / chosen.sum(-1, keepdim=True)
            return logits, chosen.to(weights.dtype), used

        return hook

    def own_routes(self) -> torch.Tensor:
        """(N, L, K) int16: the trainer's own top-k of the last forward (what R2 replays later)."""
        return torch.stack([self.records[i].own for i in range(self.layers)], dim=1).to(torch.int16)

    def flips(self) -> torch.Tensor | None:
        """(N, L) bool: the tokens of the last forward whose own top-k set differed from the replayed one, per
        layer (False where nothing was replayed); None if the forward replayed nothing."""
        if self.routes is None:
            return None
        return torch.stack([self.records[i].flipped for i in range(self.layers)], dim=1)

    def balance_loss(self) -> torch.Tensor:
        """The load-balancing loss of the last forward (Switch Transformer, Fedus et al. 2021, eq. 4-6), as HF's
        `load_balancing_loss_func` computes it over every layer and OpenRLHF's --aux_loss_coef weighs it: experts x
        the sum over experts of (its top-k slots per token) x (its mean router probability), over the real tokens;
        k when routing is uniform. The slots counted are those the layers computed with, replayed or not."""
        slots = prob_sum = None
        rows = 0
        for i in range(self.layers):
            record = self.records[i]
            used, probs = record.used, record.probs
            if self.real is not None:
                keep = self.real.to(probs.device)
                used, probs = used[keep], probs[keep]
            counts = torch.bincount(used.flatten(), minlength=self.experts).float()
            slots = counts if slots is None else slots + counts
            prob_sum = probs.sum(0) if prob_sum is None else prob_sum + probs.sum(0)
            rows += used.size(0)
        rows = max(rows, 1)
        return self.experts * torch.sum((slots / rows) * (prob_sum / rows))
