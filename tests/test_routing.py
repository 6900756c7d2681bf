"""Routing replay in the trainer's forwards (models/routing.py) and the embedded MoE model (models/tiny.py).

The references are computed by hand from the expert weights (a layer's output under given experts) or by
transformers' own code (its load-balancing loss, its routing when nothing is replayed)."""

import pytest
import torch

from reinforce_pro.models.routing import RouteReplay, RoutingDataError, check_routes, moe_routers, moe_shape
from reinforce_pro.models.tiny import build_tiny_model, build_tiny_moe_model


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return build_tiny_moe_model(tmp_path_factory.mktemp("moe") / "model", seed=3)


def load(path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for router in moe_routers(model):  # a zero-initialised router ties every expert; give it a real choice
        torch.nn.init.normal_(router.weight, std=0.5)
    return model


def batch(rows=3, width=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 99, (rows, width), generator=g)
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[0, :3] = 0  # a left-padded prompt
    return ids, mask


def forward(model, ids, mask):
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits


def test_the_embedded_moe_model_is_a_qwen3_moe_with_the_dense_models_tokenizer(moe_dir, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(moe_dir)
    assert config.model_type == "qwen3_moe"
    assert (config.num_experts, config.num_experts_per_tok, config.head_dim) == (8, 2, 32)
    dense = build_tiny_model(tmp_path / "dense")
    text = "12+7=19\n"
    assert (
        AutoTokenizer.from_pretrained(moe_dir)(text)["input_ids"]
        == AutoTokenizer.from_pretrained(dense)(text)["input_ids"]
    )
    assert moe_shape(load(moe_dir)) == (2, 8, 2)
    assert moe_shape(load(dense)) is None
    # the same directory is reused, a dense one of the same size is not taken for it
    assert build_tiny_moe_model(moe_dir, seed=3) == moe_dir
    rebuilt = build_tiny_moe_model(dense)
    assert AutoConfig.from_pretrained(rebuilt).model_type == "qwen3_moe"


def test_replay_makes_a_layer_compute_with_the_given_experts(moe_dir):
    """A hand-made case: one MoE block, every token forced onto experts 6 and 7; the output must be those two
    experts' SwiGLU outputs weighted by the router's softmax over {6, 7}, computed here from the weights."""
    model = load(moe_dir)
    block = model.model.layers[0].mlp
    replay = RouteReplay.install(model)
    x = torch.randn(1, 5, 128)
    routes = torch.full((5, 2, 2), -1, dtype=torch.int16)
    routes[:, 0] = torch.tensor([7, 6], dtype=torch.int16)
    replay.use(routes)
    out = block(x)[0]
    flat = x[0]
    probs = torch.softmax(flat @ block.gate.weight.T, dim=-1)[:, [7, 6]]
    probs = probs / probs.sum(-1, keepdim=True)
    expected = torch.zeros_like(flat)
    for k, e in enumerate((7, 6)):
        gate, up = (flat @ block.experts.gate_up_proj[e].T).chunk(2, dim=-1)
        expected += probs[:, k : k + 1] * ((torch.nn.functional.silu(gate) * up) @ block.experts.down_proj[e].T)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(replay.records[0].used, torch.tensor([[7, 6]] * 5))


def test_replaying_the_models_own_routes_changes_nothing_and_counts_no_flip(moe_dir):
    model = load(moe_dir)
    ids, mask = batch()
    replay = RouteReplay.install(model)
    replay.use(None)
    plain = forward(model, ids, mask)
    own = replay.own_routes()
    assert own.shape == (ids.numel(), 2, 2) and replay.flips() is None
    replay.use(own)
    torch.testing.assert_close(forward(model, ids, mask), plain, rtol=0, atol=1e-6)
    assert not replay.flips().any()


def test_a_replayed_route_that_differs_is_a_flip_at_that_token_and_layer_and_changes_later_positions(moe_dir):
    model = load(moe_dir)
    ids, _ = batch(rows=1, width=8)
    mask = torch.ones_like(ids)
    replay = RouteReplay.install(model)
    replay.use(None)
    plain = forward(model, ids, mask)
    routes = replay.own_routes().clone()
    others = [e for e in range(8) if e not in routes[3, 0].tolist()]
    routes[3, 0] = torch.tensor(others[:2], dtype=torch.int16)  # token 3, layer 0: two experts it did not pick
    routes[:2] = -1  # tokens 0-1: the model's own routing
    replay.use(routes)
    replayed = forward(model, ids, mask)
    flips = replay.flips()
    assert flips.nonzero().tolist() == [[3, 0]]
    assert torch.equal(replayed[0, :3], plain[0, :3])  # causal: positions before the flip are untouched
    assert (replayed[0, 3:] - plain[0, 3:]).abs().amax(-1).min() > 1e-4  # the flip and every later position move


def test_gradients_reach_the_router_under_replay(moe_dir):
    model = load(moe_dir)
    ids, mask = batch()
    replay = RouteReplay.install(model)
    replay.use(torch.tensor([1, 4]).repeat(ids.numel(), 2, 1))
    forward(model, ids, mask).logsumexp(-1).sum().backward()
    for router in moe_routers(model):
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("padded", [False, True])
def test_the_balance_loss_is_transformers_load_balancing_loss(moe_dir, padded):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    model = load(moe_dir)
    ids, mask = batch()
    if not padded:
        mask = torch.ones_like(mask)
    replay = RouteReplay.install(model)
    replay.keep_probs = True
    replay.use(None, real=mask.flatten().bool())
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, output_router_logits=True)
    expected = load_balancing_loss_func(out.router_logits, 8, 2, mask if padded else None)
    loss = replay.balance_loss()
    torch.testing.assert_close(loss, expected.float(), rtol=1e-6, atol=1e-6)
    loss.backward()
    assert moe_routers(model)[0].weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "routes, message",
    [
        (torch.zeros(4, 3, 2, dtype=torch.int16), "cannot be replayed: this model takes (tokens, 2 MoE layers, top-2)"),
        (torch.zeros(4, 2), "cannot be replayed"),
        (torch.full((4, 2, 2), 8, dtype=torch.int16), "expert id 8 out of range: this model has 8 experts"),
        (torch.full((4, 2, 2), -2, dtype=torch.int16), "expert id -2 out of range"),
        (torch.zeros(4, 2, 2), "must be integer expert ids"),
        (torch.tensor([[[0, -1], [1, 2]]] * 4), "give all k or -1s"),
    ],
)
def test_routes_the_model_cannot_replay_are_refused_in_one_line(routes, message):
    with pytest.raises(RoutingDataError) as e:
        check_routes(routes, layers=2, experts=8, top_k=2)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_routes_for_another_number_of_tokens_are_refused(moe_dir):
    model = load(moe_dir)
    ids, mask = batch()
    replay = RouteReplay.install(model)
    replay.use(torch.zeros(ids.numel() - 1, 2, 2, dtype=torch.int16))
    with pytest.raises(RoutingDataError, match=f"routes for {ids.numel() - 1} tokens given to a forward of"):
        forward(model, ids, mask)


def test_a_dense_model_has_nothing_to_replay(tmp_path):
    with pytest.raises(RoutingDataError, match="needs a mixture-of-experts model"):
        RouteReplay.install(load(build_tiny_model(tmp_path / "dense")))


def test_mixtral_routers_are_replayed_too():
    from transformers import MixtralConfig, MixtralForCausalLM

    sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2)
    config = MixtralConfig(**sizes, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    model = MixtralForCausalLM(config).eval()
    assert moe_shape(model) == (2, 4, 2)
    ids, mask = torch.randint(0, 64, (2, 6)), torch.ones(2, 6, dtype=torch.long)
    replay = RouteReplay.install(model)
    replay.use(None)
    plain = forward(model, ids, mask)
    replay.use(replay.own_routes())
    torch.testing.assert_close(forward(model, ids, mask), plain, rtol=0, atol=1e-6)
    replay.use(torch.tensor([2, 3]).repeat(12, 2, 1))
    forward(model, ids, mask)
    assert torch.equal(replay.records[1].used, torch.tensor([[2, 3]] * 12))
