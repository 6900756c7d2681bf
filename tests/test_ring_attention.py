"""Ring attention (models/ring_attention.py): with the row split over a ring of 2 and 3 gloo ranks, the
attention output and the gradients of queries, keys and values equal dense attention over the whole row, for
packed sequences and grouped-query heads; a HF model loaded with attn_implementation="ring" gives the
single-process packed forward's log-probs and gradients."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from reinforce_pro.models.ring_attention import RingContext, pad_to_ring, ring_attention, sequence_ids

B, H, HKV, D = 2, 4, 2, 8
POSITIONS = [  # two packed rows of 12 columns: sequences of 5 + 4 + 3 and 7 + 5 tokens
    [0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2],
    [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4],
]
TOL = 1e-5


def dense_attention(q, k, v, segments):
    """Reference: softmax attention over the whole row, causal within each packed sequence."""
    k, v = k.repeat_interleave(H // HKV, dim=1), v.repeat_interleave(H // HKV, dim=1)
    s = q.size(2)
    allowed = (segments[:, :, None] == segments[:, None, :]) & torch.ones(s, s, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2)) * D**-0.5
    return torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1) @ v


def inputs():
    torch.manual_seed(0)
    s = len(POSITIONS[0])
    return torch.randn(B, H, s, D), torch.randn(B, HKV, s, D), torch.randn(B, HKV, s, D), torch.randn(B, H, s, D)


def _ring_rank(rank: int, size: int, init: str, out_dir: str, model_dir: str) -> None:
    """One rank of the ring: the attention function on the constructed row, then the tiny model's log-probs
    and gradients on the packing tests' batch; saves both for the test process to compare."""
    from test_packing import RESPONSE, mixed_batch
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.ring_attention import register, ring_response_log_probs

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        q, k, v, grad = inputs()
        segments = sequence_ids(torch.tensor(POSITIONS))
        ring = RingContext(segments, q.size(2) // size, rank, list(range(size)))
        cols = ring.columns(rank)
        mine = [x[:, :, cols].clone().requires_grad_() for x in (q, k, v)]
        out = ring_attention(*mine, ring)
        out.backward(grad[:, :, cols])
        attention = [out.detach(), *(x.grad for x in mine)]

        register()
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="ring")
        seq, mask = mixed_batch()
        lp, _ = ring_response_log_probs(model, seq, mask, RESPONSE, rank, list(range(size)), temperature=0.7)
        (lp * loss_weights(lp)).sum().backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        torch.save({"attention": attention, "log_probs": lp.detach(), "grads": grads}, f"{out_dir}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def loss_weights(lp: torch.Tensor) -> torch.Tensor:
    return torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)


def run_ring(target, size: int, *args) -> list:
    """Run `target(rank, size, init, out_dir, *args)` on `size` gloo ranks; what each rank saved, in order."""
    with tempfile.TemporaryDirectory() as out_dir:
        init = f"file://{out_dir}/rendezvous"
        mp.start_processes(target, args=(size, init, out_dir, *args), nprocs=size, start_method="spawn")
        return [torch.load(os.path.join(out_dir, f"{r}.pt")) for r in range(size)]


@pytest.fixture(scope="module", params=[2, 3])
def ring_results(request, tmp_path_factory):
    """(ring size, the tiny model's directory, what each rank of a ring of that size saved): one set of
    processes per size serves both tests."""
    from reinforce_pro.models.tiny import build_tiny_model

    model_dir = str(build_tiny_model(tmp_path_factory.mktemp("ring") / "tiny", seed=0))
    return request.param, model_dir, run_ring(_ring_rank, request.param, model_dir)


def test_ring_attention_equals_dense_attention_forward_and_backward(ring_results):
    _, _, parts = ring_results
    q, k, v, grad = (x.requires_grad_() for x in inputs())
    want = dense_attention(q, k, v, sequence_ids(torch.tensor(POSITIONS)))
    want.backward(grad.detach())
    got = [torch.cat([p["attention"][i] for p in parts], dim=2) for i in range(4)]
    for name, a, b in zip(("output", "dq", "dk", "dv"), got, (want, q.grad, k.grad, v.grad), strict=True):
        assert (a - b.detach()).abs().max() < TOL, name


def test_a_model_on_a_ring_gives_the_packed_forwards_log_probs_and_gradients(ring_results):
    """The ring's log-probs equal the single-process packed forward's on every rank, and the ring's parameter
    gradients, summed over its ranks, equal the single-process gradient of the same loss."""
    from test_packing import RESPONSE, mixed_batch
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.logprobs import response_log_probs

    _, model_dir, parts = ring_results
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    seq, mask = mixed_batch()
    want, _ = response_log_probs(model, seq, mask, RESPONSE, 0.7, packed=True)
    (want * loss_weights(want)).sum().backward()
    for part in parts:
        assert (part["log_probs"] - want.detach()).abs().max() < TOL
    for name, p in model.named_parameters():
        ring_grad = sum(part["grads"][name] for part in parts if name in part["grads"])
        assert (ring_grad - p.grad).abs().max() < TOL * max(1.0, p.grad.abs().max().item()), name


def test_sequence_ids_and_padding_to_the_ring():
    pos = torch.tensor([[0, 1, 2, 0, 1]])
    assert sequence_ids(pos).tolist() == [[1, 1, 1, 2, 2]]
    ids, padded = pad_to_ring(torch.arange(5)[None], pos, 4)
    assert ids.shape == (1, 8) and padded.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]  # filler: a sequence of its own
    assert sequence_ids(padded).tolist() == [[1, 1, 1, 2, 2, 3, 3, 3]]


def _moe_model(path: str, attn: str):
    """The tiny MoE model with routers that make real choices (as tests/test_routing.py loads it)."""
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.routing import moe_routers

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn)
    for router in moe_routers(model):
        torch.nn.init.normal_(router.weight, std=0.5)
    return model


def _moe_ring_rank(rank: int, size: int, init: str, out_dir: str, moe_dir: str, routes: torch.Tensor) -> None:
    """One rank of a ring running the MoE model under routing replay: the scoring pass (replayed log-probs,
    flips and own routes in the rows' grid) and a training forward with the balance loss, backward included."""
    from test_packing import RESPONSE, mixed_batch

    from reinforce_pro.models.ring_attention import RingMember, register, ring_response_log_probs
    from reinforce_pro.models.routing import RingLayout, RouteReplay, RoutingPass, replay_routes
    from reinforce_pro.workers.base import batched_log_probs

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        register()
        model, member = _moe_model(moe_dir, "ring"), RingMember(rank, list(range(size)))
        replay = RouteReplay.install(model)
        replay.ring = member
        seq, mask = mixed_batch()

        def on_ring(model, seq, mask, keep, temperature, packed=True, sampling_filter=None):
            return ring_response_log_probs(model, seq, mask, keep, rank, member.ranks, temperature=temperature)

        routing = RoutingPass(replay, routes)
        scored = batched_log_probs(model, seq, mask, RESPONSE, 1.0, 4, None, True, on_ring, routing=routing)
        replay.keep_probs = True
        replay_routes(replay, routes, mask, True, RingLayout.of_ring(mask, member))
        lp, _ = ring_response_log_probs(model, seq, mask, RESPONSE, rank, member.ranks)
        balance = replay.balance_loss()
        ((lp * loss_weights(lp)).sum() + balance).backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        result = {"scored": scored, **routing.result(), "log_probs": lp.detach(), "balance": balance.detach()}
        torch.save({**result, "grads": grads}, f"{out_dir}/{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def moe_case(tmp_path_factory):
    """The MoE model's directory and the routes its ring replays: its own routes with one token's experts in one
    layer changed (a flip the ring must find, and a replay that moves the later log-probs of that row)."""
    from test_packing import mixed_batch

    from reinforce_pro.models.routing import RouteReplay
    from reinforce_pro.models.tiny import build_tiny_moe_model

    moe_dir = str(build_tiny_moe_model(tmp_path_factory.mktemp("ring_moe") / "moe", seed=3))
    model = _moe_model(moe_dir, "sdpa")
    replay = RouteReplay.install(model)
    seq, mask = mixed_batch()
    replay.use(None)
    model(input_ids=seq, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=False)
    routes = replay.own_routes().view(*seq.shape, 2, 2)
    row, position = 1, seq.size(1) - 5  # a row with a long response: the flip predicts one of its tokens
    routes[row, position, 1] = torch.tensor([e for e in range(8) if e not in routes[row, position, 1].tolist()][:2])
    routes[~mask.bool()] = -1
    return moe_dir, routes


@pytest.mark.parametrize("size", [2, 3])
def test_routing_replay_and_the_balance_loss_on_a_ring_equal_the_packed_forwards(moe_case, size):
    """--routing_replay with --ring_attn_size: each rank's routers see its block of the packed rows, so each gets
    the routes of its block, and what they did comes back in the rows' grid from the whole ring. The replayed
    log-probs, the flips (the one changed route, in its layer), the trainer's own routes, the balance loss and
    the parameter gradients (summed over the ring) equal the single-process packed forward's."""
    from test_packing import RESPONSE, mixed_batch

    from reinforce_pro.models.logprobs import response_log_probs
    from reinforce_pro.models.routing import PackedLayout, RouteReplay, RoutingPass, replay_routes
    from reinforce_pro.workers.base import batched_log_probs

    moe_dir, routes = moe_case
    parts = run_ring(_moe_ring_rank, size, moe_dir, routes)
    model = _moe_model(moe_dir, "sdpa")
    replay = RouteReplay.install(model)
    seq, mask = mixed_batch()
    routing = RoutingPass(replay, routes)
    scored = batched_log_probs(model, seq, mask, RESPONSE, 1.0, 4, None, True, routing=routing)
    want = routing.result()
    replay.keep_probs = True
    replay_routes(replay, routes, mask, True, PackedLayout.of(model, mask))
    lp, _ = response_log_probs(model, seq, mask, RESPONSE, 1.0, packed=True)
    balance = replay.balance_loss()
    ((lp * loss_weights(lp)).sum() + balance).backward()
    action = mask[:, -RESPONSE:].bool()
    assert want["flips"][action].nan_to_num(0).sum() == 1  # the one changed route is found
    for part in parts:
        torch.testing.assert_close(part["scored"][action], scored[action], rtol=0, atol=TOL)
        assert torch.equal(part["flips"].nan_to_num(-1), want["flips"].nan_to_num(-1))
        assert torch.equal(part["own_routes"][mask.bool()], want["own_routes"][mask.bool()])
        torch.testing.assert_close(part["log_probs"], lp.detach(), rtol=0, atol=TOL)
        torch.testing.assert_close(part["balance"], balance.detach(), rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        ring_grad = sum(part["grads"][name] for part in parts if name in part["grads"])
        assert (ring_grad - p.grad).abs().max() < TOL * max(1.0, p.grad.abs().max().item()), name
