"""Capture, inside a vLLM worker, the top-k experts every MoE layer picked for every token the engine fed
through the model: what rollout routing replay (models/routing.py) gives the trainer.

vLLM's own capture (`enable_return_routed_experts`) needs its GPU model runner; this one works wherever the
model's routers are ordinary modules: a forward hook on each MoE layer's router (`<block>.gate`, the module
the fused-MoE layer takes its logits from) takes the top-k of its logits. The tokens of a forward belong to
several requests; the runner lays them out request after request in its input batch, each request's tokens
starting at its count of computed tokens. A wrapper of the runner's `_prepare_inputs` notes that layout
(request ids, tokens scheduled, start positions) for the hooks of the forward that follows, so every route is
filed under its request and position: a prompt prefilled in chunks, a request preempted and recomputed (its
positions written again) and batched decoding all come out right. Hooks fire only in eager mode (a compiled
graph does not run Python hooks per step), so an engine that captures runs with enforce_eager; and a
prefix-cache hit skips the forward of the cached tokens, so capture needs prefix caching off.

This module must stay importable without Ray or the trainer: vLLM imports it in its workers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Step:
    req_ids: list[str]
    counts: list[int]  # tokens of each request in this forward
    starts: list[int]  # the position of each request's first token in this forward
    tokens: int


class RouteRecorder:
    """Files each forward's per-layer top-k experts under (request, position)."""

    def __init__(self, runner, experts_per_token: int):
        model = runner.get_model()
        self.routers = [m.gate for m in model.modules() if hasattr(m, "experts") and hasattr(m, "gate")]
        if not self.routers:
            raise ValueError("route capture needs a mixture-of-experts model; this engine's model has no router")
        self.runner, self.experts_per_token = runner, experts_per_token
        self.step: _Step | None = None
        self.layer_routes: list = [None] * len(self.routers)
        self.store: dict[str, list] = {}  # request id -> [(start, (n, L, K) int16)]
        prepare = runner._prepare_inputs

        def noting_layout(scheduler_output, num_scheduled_tokens, *args, **kwargs):
            out = prepare(scheduler_output, num_scheduled_tokens, *args, **kwargs)
            self._note_layout(num_scheduled_tokens)
            return out

        runner._prepare_inputs = noting_layout
        for layer, router in enumerate(self.routers):
            router.register_forward_hook(self._hook(layer))

    def _note_layout(self, num_scheduled_tokens) -> None:
        batch = self.runner.input_batch
        n = batch.num_reqs
        counts = [int(c) for c in num_scheduled_tokens[:n]]
        starts = [int(s) for s in batch.num_computed_tokens_cpu[:n]]
        self.step = _Step(list(batch.req_ids[:n]), counts, starts, sum(counts))

    def _hook(self, layer: int):
        import torch

        def hook(module, args, output):
            step = self.step
            if step is None:  # a warm-up or profiling forward: no request's tokens
                return
            logits = output[0] if isinstance(output, tuple) else output
            top = torch.topk(logits[: step.tokens].float(), self.experts_per_token, dim=-1).indices
            self.layer_routes[layer] = top.to(torch.int16).cpu()
            if layer == len(self.routers) - 1:
                self._file(step, torch.stack(self.layer_routes, dim=1))
                self.step, self.layer_routes = None, [None] * len(self.routers)

        return hook

    def _file(self, step: _Step, routes) -> None:
        offset = 0
        for req_id, count, start in zip(step.req_ids, step.counts, step.starts, strict=True):
            self.store.setdefault(req_id, []).append((start, routes[offset : offset + count]))
            offset += count

    def take(self, request_ids: list[str]) -> dict:
        """{request id: (positions, L, K) int16} for the requests of one `LLM.generate` (their ids as its
        outputs name them), -1 at a position no forward covered; forgets every request. vLLM files a request
        under its id plus a dash and a random suffix ("3" -> "3-<8 hex digits>")."""
        import torch

        by_id = {req_id.rsplit("-", 1)[0]: req_id for req_id in self.store}
        by_id.update({req_id: req_id for req_id in self.store})
        result = {}
        for rid in request_ids:
            parts = self.store.get(by_id.get(rid, ""), [])
            length = max((start + len(r) for start, r in parts), default=0)
            routes = torch.full((length, len(self.routers), self.experts_per_token), -1, dtype=torch.int16)
            for start, r in parts:  # in order: a recomputed position keeps its latest routes
                routes[start : start + len(r)] = r
            result[rid] = routes
        self.store = {}
        return result
