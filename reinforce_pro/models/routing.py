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
(rows times columns of the padded batch, or the packed tokens of a --packing_samples or ring forward: PackedLayout,
RingLayout), per MoE layer; -1 on a token leaves
it to the trainer's own router. Each forward records, per layer, the tokens whose own top-k set differs from the
given one (`flips`), its own routes (`own`, for R2), and the router softmax and expert counts the load-balancing
loss needs.

Routers are read by their output: HF's MoE routers (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE in transformers 5)
return (router_logits, top-k weights, top-k indices) from the flattened hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

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


def is_moe_dir(path: str) -> bool:
    """Whether the HF model directory at `path` is a mixture of experts (its config names experts per token)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    config = getattr(config, "get_text_config", lambda: config)()
    return bool(getattr(config, "num_experts_per_tok", 0))


def check_routes(routes: torch.Tensor, layers: int, experts: int, experts_per_token: int) -> None:
    """Refuse, in one line, routes this model cannot replay (the hook checks their count against its forward's)."""
    want = f"(tokens, {layers} MoE layers, top-{experts_per_token})"
    if routes.dim() != 3 or tuple(routes.shape[1:]) != (layers, experts_per_token):
        raise RoutingDataError(f"routes of shape {tuple(routes.shape)} cannot be replayed: this model takes {want}")
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
    experts_per_token: int  # the router's top-k (HF: num_experts_per_tok)
    routes: torch.Tensor | None = None  # (N, L, K) for the next forwards, or None: the trainer's own routing
    real: torch.Tensor | None = None  # (N,) bool, the tokens that are not padding (the load-balancing loss)
    records: dict[int, LayerRecord] = field(default_factory=dict)  # layer -> what it saw in the last forward
    keep_probs: bool = False  # record the softmax with its graph (only when the load-balancing loss is wanted)
    force: bool = True  # False: compare the given routes with the trainer's own, and route as trained
    ring: object = None  # --ring_attn_size: the RingMember whose forwards each see one block of every row

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

    def use(self, routes: torch.Tensor | None, real: torch.Tensor | None = None, force: bool = True) -> None:
        """Replay `routes` (N, L, K; -1: own routing) in the forwards that follow, or None: route as trained;
        with `force` False the routes are only compared (flips) and the trainer routes itself. `real`: (N,)
        which tokens are not padding. Clears what earlier forwards recorded."""
        if routes is not None:
            check_routes(routes, self.layers, self.experts, self.experts_per_token)
        self.routes, self.real, self.force, self.records = routes, real, force, {}

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
                known = given[:, 0] >= 0
                flipped = known & (own.sort(-1).values != given.sort(-1).values).any(-1)
                if self.force:
                    used = torch.where(known.unsqueeze(-1), given, own)
            self.records[layer] = LayerRecord(
                own.detach(), flipped, probs if self.keep_probs else probs.detach(), used.detach()
            )
            if given is None or not self.force:
                return output
            chosen = probs.gather(-1, used)
            if getattr(module, "norm_topk_prob", False) or type(module).__name__ in ALWAYS_RENORMALISED:
                chosen = chosen / chosen.sum(-1, keepdim=True)
            return logits, chosen.to(weights.dtype), used

        return hook

    def layout(self, model, mask: torch.Tensor) -> PackedLayout:
        """Where a packed forward (--packing_samples) of rows with attention mask `mask` puts their tokens for these
        routers: this rank's block of them on a ring (--ring_attn_size), else `model`'s packing."""
        if self.ring is not None:
            return RingLayout.of_ring(mask, self.ring)
        return PackedLayout.of(model, mask)

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
        k when routing is uniform. The slots counted are those the layers computed with, replayed or not. On a
        ring every rank saw one block of the rows: the counts and sums are the whole ring's, and each rank's
        gradient is that of its own tokens' probabilities (the ring's gradients add up to one process's)."""
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
        rows = torch.tensor([float(rows)], device=slots.device)
        if self.ring is not None:
            import torch.distributed as dist

            from reinforce_pro.models.ring_attention import sum_over_ring

            counted = torch.cat([slots, rows])
            dist.all_reduce(counted, group=self.ring.group)
            slots, rows = counted[:-1], counted[-1:]
            prob_sum = sum_over_ring(prob_sum, self.ring.group)
        rows = rows.clamp(min=1.0)
        return self.experts * torch.sum((slots / rows) * (prob_sum / rows))


@dataclass(frozen=True)
class PackedLayout:
    """Where the padded rows' tokens sit in the padding-free forward --packing_samples makes of them
    (models/packing.py: pack): the routers then see the packed tokens, filler included, not the padded grid."""

    index: torch.Tensor  # (b, w) long, each real token's flat position in the packed forward; -1 for padding
    size: int  # tokens of the packed forward (its bins x their width)

    @classmethod
    def of(cls, model, attention_mask: torch.Tensor) -> PackedLayout:
        """The layout models.packing.response_logits packs `attention_mask`'s rows into, for `model`'s kernel."""
        from reinforce_pro.models.packing import ONE_ROW_ATTENTION, attention_kernel, pack

        packed = pack(attention_mask, attention_mask, one_row=attention_kernel(model) in ONE_ROW_ATTENTION)
        return cls(packed.index.cpu(), packed.input_ids.numel())

    def pack(self, values: torch.Tensor, fill) -> torch.Tensor:
        """(b, w, ...) per padded position -> (size, ...) per packed token; `fill` at filler and unplaced tokens."""
        real = self.index >= 0
        out = torch.full((self.size, *values.shape[2:]), fill, dtype=values.dtype, device=values.device)
        out[self.index[real].to(values.device)] = values[real.to(values.device)]
        return out

    def unpack(self, values: torch.Tensor, fill) -> torch.Tensor:
        """(size, ...) per packed token -> (b, w, ...) per padded position; `fill` at padding."""
        real = (self.index >= 0).to(values.device)
        out = torch.full((*self.index.shape, *values.shape[1:]), fill, dtype=values.dtype, device=values.device)
        out[real] = values[self.index.to(values.device)[real]]
        return out

    def real(self) -> torch.Tensor:
        """(size,) bool: the packed tokens that are real (not a bin's filler)."""
        return self.pack(torch.ones(self.index.shape, dtype=torch.bool), False)


@dataclass(frozen=True)
class RingLayout(PackedLayout):
    """Where the padded rows' tokens sit in this rank's share of a ring forward (--ring_attn_size,
    models/ring_attention.py: ring_response_log_probs): every rank of the ring packs the whole batch, widens
    its bins to a multiple of the ring and forwards one block of their columns, so its routers see only the
    tokens of that block. What a rank unpacks comes from the whole ring (each real token lies in one block)."""

    covered: torch.Tensor  # (b, w) bool, the real tokens of the rows (each in some rank's block)
    group: object  # the ring's process group (None: the default group)

    @classmethod
    def of_ring(cls, attention_mask: torch.Tensor, ring) -> RingLayout:
        """This rank's layout; `ring`: its RingMember (rank in the ring, the ring's ranks and group)."""
        from reinforce_pro.models.packing import pack
        from reinforce_pro.models.ring_attention import block_places, ring_block

        packed = pack(attention_mask, attention_mask)
        width = packed.input_ids.size(1)
        block = ring_block(width, len(ring.ranks))
        index = packed.index.cpu()
        in_block, local = block_places(index, width, block, ring.rank * block)
        mine = (index >= 0) & in_block
        local = torch.where(mine, local, -1)
        return cls(local, packed.input_ids.size(0) * block, attention_mask.bool().cpu(), ring.group)

    def unpack(self, values: torch.Tensor, fill) -> torch.Tensor:
        """(size, ...) per token of this rank's block -> (b, w, ...) per padded position, every rank's blocks
        gathered; `fill` at padding. Every rank of the ring must call it."""
        import torch.distributed as dist

        mine = super().unpack(values, fill)
        placed, covered = (self.index >= 0).to(mine.device), self.covered.to(mine.device)
        shifted = torch.zeros(mine.shape, dtype=torch.long, device=mine.device)  # 0: another rank's token
        shifted[placed] = mine[placed].long() + 1
        dist.all_reduce(shifted, group=self.group)
        out = torch.full_like(mine, fill)
        out[covered] = (shifted[covered] - 1).to(mine.dtype)
        return out


def replay_routes(replay: RouteReplay, routes: torch.Tensor | None, mask: torch.Tensor, force: bool = True,
                  layout: PackedLayout | None = None) -> None:  # fmt: skip
    """Before a forward over rows whose (b, w) attention mask is `mask`: replay `routes` (b, w, L, K) or route
    itself (None), in the padded grid or, under --packing_samples, in `layout`'s packed order."""
    if layout is None:
        given = None if routes is None else routes.reshape(-1, replay.layers, replay.experts_per_token)
        replay.use(given, mask.flatten().bool(), force)
        return
    given = None if routes is None else layout.pack(routes, -1)
    replay.use(given, layout.real(), force)


@dataclass
class RoutingPass:
    """One scoring pass over a batch (its forwards cut into row chunks, padding columns trimmed) under a
    RouteReplay: hands each forward its rows' routes, and gathers per row what the routers did.

    `routes` (B, S, L, K) are aligned with the batch's sequences; `force` False only compares them."""

    replay: RouteReplay
    routes: torch.Tensor | None
    force: bool = True
    flips: list[torch.Tensor] = field(default_factory=list)  # per chunk (b, T, L) float, NaN: not compared
    own: list[torch.Tensor] = field(default_factory=list)  # per chunk (b, S, L, K) int16, -1 on trimmed columns

    def before(self, rows: slice, columns: slice, mask: torch.Tensor, layout: PackedLayout | None = None) -> None:
        """Before the forward of `rows`, whose columns `columns` are kept; mask: their (b, w) attention mask;
        `layout`: where a packed forward (--packing_samples) puts their tokens."""
        given = None if self.routes is None else self.routes[rows, columns]
        replay_routes(self.replay, given, mask, self.force, layout)
        self._chunk = (columns, tuple(mask.shape), given, layout)

    def after(self, keep: int, num_actions: int, width: int) -> None:
        """After that forward: `keep` response columns were scored out of `num_actions`; `width` = S."""
        columns, (b, w), given, layout = self._chunk
        layers, k = self.replay.layers, self.replay.experts_per_token
        flips = torch.full((b, num_actions, layers), float("nan"))
        compared, own_routes = self.replay.flips(), self.replay.own_routes()
        if layout is not None:  # back from the packed order to the rows' grid
            compared = None if compared is None else layout.unpack(compared, False)
            own_routes = layout.unpack(own_routes, -1)
        if compared is not None:  # the positions whose outputs predict the response tokens: w-keep-1 .. w-2
            known = (given[..., 0] >= 0).reshape(b, w, layers)[:, w - keep - 1 : w - 1]
            found = compared.reshape(b, w, layers)[:, w - keep - 1 : w - 1].float().cpu()
            flips[:, :keep] = torch.where(known.cpu(), found, float("nan"))
        own = torch.full((b, width, layers, k), -1, dtype=torch.int16)
        own[:, columns] = own_routes.reshape(b, w, layers, k).cpu()
        self.flips.append(flips)
        self.own.append(own)

    def result(self) -> dict[str, torch.Tensor]:
        """{"flips": (B, T, L) float (1: the trainer's own top-k set differs from the given one at the position
        that predicts response token t, NaN where nothing was compared), "own_routes": (B, S, L, K) int16}."""
        return {"flips": torch.cat(self.flips), "own_routes": torch.cat(self.own)}
