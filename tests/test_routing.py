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
    # causal: positions before the flip are untouched, up to the rounding of expert matmuls over other row counts
    torch.testing.assert_close(replayed[0, :3], plain[0, :3], rtol=0, atol=1e-6)
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
        check_routes(routes, layers=2, experts=8, experts_per_token=2)
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


def test_a_scoring_pass_hands_each_chunk_its_rows_routes_and_maps_flips_to_response_tokens(moe_dir):
    """batched_log_probs cuts the batch into row chunks and trims padding columns; the routes (B, S, L, K) must
    follow. A route changed at one position of one row is a flip of the response token that position predicts,
    and of no other; with the model's own routes everywhere nothing flips and the log-probs are the plain ones."""
    from reinforce_pro.models.routing import RoutingPass
    from reinforce_pro.workers.base import batched_log_probs

    model = load(moe_dir)
    rows, prompt, t = 5, 6, 7
    ids = torch.randint(5, 99, (rows, prompt + t), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    for i in range(rows):
        mask[i, : i % 3] = 0  # left padding
        mask[i, prompt + t - (i % 4) :] = 0  # right padding
    replay = RouteReplay.install(model)
    plain = batched_log_probs(model, ids, mask, t, 1.0, micro=rows)
    own = torch.full((rows, prompt + t, 2, 2), -1, dtype=torch.int16)
    for i in range(rows):  # each row's own routes, from a forward of that row alone
        real = mask[i].bool()
        replay.use(None)
        forward(model, ids[i : i + 1, real], torch.ones(1, int(real.sum()), dtype=torch.long))
        own[i, real] = replay.own_routes()
    routing = RoutingPass(replay, own)
    scored = batched_log_probs(model, ids, mask, t, 1.0, micro=2, routing=routing)
    result = routing.result()
    action = mask[:, prompt:].bool()  # padding columns hold whatever each chunk's trimmed forward left there
    torch.testing.assert_close(scored[action], plain[action], rtol=0, atol=1e-5)
    assert not result["flips"][action].nan_to_num(1.0).any()  # compared at every response token, none flipped
    assert torch.equal(result["own_routes"][mask.bool()], own[mask.bool()])
    changed = own.clone()
    row, position = 3, prompt + 2  # the position whose output predicts response token 3
    changed[row, position, 1] = torch.tensor([e for e in range(8) if e not in own[row, position, 1].tolist()][:2])
    routing = RoutingPass(replay, changed, force=False)
    compared = batched_log_probs(model, ids, mask, t, 1.0, micro=2, routing=routing)
    flips = routing.result()["flips"]
    torch.testing.assert_close(compared[action], plain[action], rtol=0, atol=1e-5)  # only compared: none replayed
    assert flips[action].nan_to_num(0.0).nonzero().tolist() == [[int(action[:row].sum()) + 3, 1]]
    routing = RoutingPass(replay, changed)
    replayed = batched_log_probs(model, ids, mask, t, 1.0, micro=2, routing=routing)
    moved = ((replayed - plain).abs() > 1e-5) & action
    assert moved[row, 3:][action[row, 3:]].all() and not moved[row, :3].any() and not moved[[0, 1, 2, 4]].any()


def test_a_packed_scoring_pass_replays_and_measures_as_the_padded_one(moe_dir):
    """--packing_samples: the routers see the rows' real tokens packed, filler included, not the padded grid.
    The routes go in in the packed order and come back in the rows' grid: replayed log-probs, flips, the
    trainer's own routes and the balance loss equal the padded pass's."""
    from reinforce_pro.models.routing import PackedLayout, RoutingPass, replay_routes
    from reinforce_pro.workers.base import batched_log_probs

    model = load(moe_dir)
    rows, prompt, t = 5, 6, 7
    ids = torch.randint(5, 99, (rows, prompt + t), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    for i in range(rows):
        mask[i, : i % 3] = 0
        mask[i, prompt + t - (i % 4) :] = 0
    replay = RouteReplay.install(model)
    replay.use(None)
    forward(model, ids, mask)
    own = replay.own_routes().view(rows, prompt + t, 2, 2)
    changed = own.clone()
    changed[3, prompt + 2, 1] = torch.tensor([e for e in range(8) if e not in own[3, prompt + 2, 1].tolist()][:2])
    action = mask[:, prompt:].bool()
    results = {}
    for packed in (False, True):
        routing = RoutingPass(replay, changed)
        lp = batched_log_probs(model, ids, mask, t, 1.0, micro=2, packed=packed, routing=routing)
        results[packed] = (lp, routing.result())
    (lp_pad, pad), (lp_pack, pack) = results[False], results[True]
    torch.testing.assert_close(lp_pack[action], lp_pad[action], rtol=0, atol=1e-5)
    assert torch.equal(pack["flips"][action].isnan(), pad["flips"][action].isnan())
    assert torch.equal(pack["flips"][action].nan_to_num(0), pad["flips"][action].nan_to_num(0))
    assert pack["flips"][action].nan_to_num(0).sum() == 1  # the one changed route, in its layer
    assert torch.equal(pack["own_routes"][mask.bool()], pad["own_routes"][mask.bool()])
    replay.keep_probs = True  # the balance loss over the real tokens only, packed or padded
    layout = PackedLayout.of(model, mask)
    assert layout.size > int(mask.sum())  # the bins' filler is part of the packed forward
    losses = []
    for packed_layout in (None, layout):
        replay_routes(replay, changed, mask, True, packed_layout)
        if packed_layout is None:
            forward(model, ids, mask)
        else:
            from reinforce_pro.models.packing import pack, packed_forward

            packed_forward(model, pack(ids, mask))
        losses.append(replay.balance_loss())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(RoutingDataError, match="routes for"):
        replay.use(torch.zeros(3, 2, 2, dtype=torch.int16))
        forward(model, ids, mask)


def test_routing_metrics_count_flips_over_response_tokens_and_layers_only():
    from reinforce_pro.trainer.experience_builder import agreement_line, routing_metrics

    nan = float("nan")
    flips = torch.tensor(
        [
            [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]],  # row 0: 3 response tokens, a flip at tokens 0 and 2
            [[0.0, 0.0], [nan, nan], [1.0, 0.0]],  # row 1: token 1 has no engine routes; token 2 is padding
        ]
    )
    action = torch.tensor([[True, True, True], [True, True, False]])
    m = routing_metrics(flips, action, replayed=True)
    assert m["routing/flip_frac"] == pytest.approx(3 / 8)  # 4 tokens with routes x 2 layers
    assert m["routing/flip_frac/layer0"] == pytest.approx(2 / 4) and m["routing/flip_frac/layer1"] == pytest.approx(
        1 / 4
    )
    assert m["routing/token_flip_frac"] == pytest.approx(2 / 4) and m["routing/row_flip_frac"] == pytest.approx(1 / 2)
    assert m["routing_pos/flip_frac/0-1"] == pytest.approx(1 / 6) and m["routing_pos/flip_frac/2-3"] == 1.0
    assert m["routing/replayed"] == 1.0
    gaps = {"rollout/logprob_abs_diff_mean": 1e-7, "rollout/logprob_abs_diff_p99": 1e-6}
    line = agreement_line({**gaps, "rollout/logprob_abs_diff_max": 1e-6, **m}, "float32", "fp32", None)
    assert "experts differ at 37.50% of (token, layer) pairs, then replayed the engine's" in line
    assert routing_metrics(torch.full((1, 2, 2), nan), torch.ones(1, 2, dtype=torch.bool), False) == {}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--routing_replay", "r4"], "invalid choice: 'r4'"),
        (["--aux_loss_coef", "-0.1"], "--aux_loss_coef"),
        (["--embedded_model", "moe", "--pretrain", "/x"], "--embedded_model moe picks the built-in model"),
    ],
)
def test_routing_flags_that_cannot_work_stop_in_one_line(argv, message, capsys):
    from reinforce_pro.cli.train_ppo_ray import parse

    with pytest.raises(SystemExit) as e:
        parse(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("flags", [["--routing_replay", "r3"], ["--aux_loss_coef", "0.01"]])
def test_moe_flags_on_a_dense_model_stop_before_anything_starts(tmp_path, capsys, flags):
    from reinforce_pro.cli.train_ppo_ray import main

    dense = build_tiny_model(tmp_path / "dense")
    assert main(["--pretrain", str(dense), "--max_len", "64", "--save_path", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err
    assert "needs a mixture-of-experts model" in err and err.count("\n") == 1, err


def test_verls_values_of_the_replay_mode_are_read_as_ours():
    from reinforce_pro.cli.train_ppo_ray import parse

    for given, mode in [("R3", "r3"), ("disabled", "none"), ("r2", "r2")]:
        _, cfg = parse(["--routing_replay", given])
        assert cfg.forward.routing_replay == mode == cfg.experience.routing_replay


@pytest.mark.parametrize("kernel", ["batched_mm", "grouped_mm"])
def test_the_expert_kernels_compute_what_eager_does_and_replay_reaches_them(moe_dir, kernel):
    """--ds.experts_implementation: transformers' batched and grouped expert kernels run on CPU and agree with the
    eager loop, with the router hooks (replay) in front of them."""
    from transformers import AutoModelForCausalLM

    ids, mask = batch()
    outputs = {}
    for name in ("eager", kernel):
        model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32, experts_implementation=name).eval()
        for router in moe_routers(model):
            torch.nn.init.normal_(router.weight, std=0.5, generator=torch.Generator().manual_seed(0))
        replay = RouteReplay.install(model)
        replay.use(None)
        with torch.no_grad():
            plain = forward(model, ids, mask)
        replay.use(torch.tensor([3, 5]).repeat(ids.numel(), 2, 1))
        with torch.no_grad():
            outputs[name] = (plain, forward(model, ids, mask))
    for a, b in zip(outputs["eager"], outputs[kernel], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert (outputs["eager"][0] - outputs["eager"][1]).abs().max() > 1e-3  # the replayed experts are others


def test_a_partial_rollouts_routes_keep_what_each_chunk_fed_first():
    from reinforce_pro.experience import extend_routes

    first = torch.full((6, 2, 2), 1, dtype=torch.int16)  # chunk 1 fed the prompt (4) and 2 of its 3 sampled tokens
    second = torch.full((9, 2, 2), 2, dtype=torch.int16)  # chunk 2 re-fed those 7 tokens and 2 of its own
    routes = extend_routes(extend_routes(None, first), second)
    assert routes.shape == (9, 2, 2) and (routes[:6] == 1).all() and (routes[6:] == 2).all()
    assert extend_routes(first, None) is None  # an engine that records none
