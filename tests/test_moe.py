"""Mixture-of-experts end to end on CPU: the engine records every token's experts (rollout/route_capture.py), the
routes travel with the samples (partial rollouts, agent episodes and self-play roles included), and a run replays
them (models/routing.py).

One Ray cluster and one fp32 vLLM engine of a tiny Qwen3-MoE are shared by the tests here. The reference for the
engine's routes is transformers' own router in an fp32 forward of the same token ids: on equal fp32 weights the
two must pick the same top-k experts at every position.
"""

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("deepspeed")
ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from reinforce_pro.cli.train_ppo_ray import parse  # noqa: E402
from reinforce_pro.models.routing import RouteReplay, moe_routers  # noqa: E402
from reinforce_pro.models.tiny import build_tiny_moe_model  # noqa: E402
from reinforce_pro.rollout.sampler import PartialRollout, RolloutConfig, Sampler  # noqa: E402
from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine  # noqa: E402
from reinforce_pro.run.driver import build_and_fit  # noqa: E402
from reinforce_pro.run.prepare import prepare  # noqa: E402
from reinforce_pro.workers.launcher import start_ray  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory) -> str:
    """The embedded MoE model with routers that choose decisively (a fresh router's near-zero logits make ties)."""
    from transformers import AutoModelForCausalLM

    path = build_tiny_moe_model(tmp_path_factory.mktemp("moe") / "model", seed=1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(1)
    for router in moe_routers(model):
        torch.nn.init.normal_(router.weight, std=0.5)
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def engine(moe_model):
    start_ray(logical_cpus=8)
    config = EngineConfig(model_path=moe_model, dtype="float32", max_model_len=96, seed=0, capture_routes=True)
    actor = ray.remote(VLLMEngine).options(num_cpus=1).remote(config)
    yield actor
    ray.kill(actor)
    ray.shutdown()


def prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(n)
    return [[1] + torch.randint(5, 99, (3 + i % 9,), generator=g).tolist() for i in range(n)]


def reference_routes(model_dir: str, sequences: list[list[int]]) -> list[torch.Tensor]:
    """transformers' own top-k experts of every position of each sequence, one fp32 forward per sequence."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    replay = RouteReplay.install(model)
    out = []
    for seq in sequences:
        replay.use(None)
        with torch.no_grad():
            model(torch.tensor([seq]))
        out.append(replay.own_routes())
    return out


def same_sets(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.sort(-1).values, b.sort(-1).values)


def test_the_engine_records_every_fed_tokens_experts_as_an_fp32_reference_forward_picks_them(engine, moe_model):
    """48 prompts sampled together (batched decoding, requests of different lengths in one forward): each row's
    routes cover its prompt and every sampled token but the last, and equal transformers' at every position."""
    batch = prompts(48)
    generations = ray.get(engine.generate.remote(batch, dict(temperature=1.0, max_tokens=20)))
    fed = [p + g.token_ids[:-1] for p, g in zip(batch, generations, strict=True)]
    for g, seq, ref in zip(generations, fed, reference_routes(moe_model, fed), strict=True):
        assert g.routes.shape == (len(seq), 2, 2) and g.routes.dtype == torch.int16
        assert same_sets(g.routes, ref)


def test_partial_rollouts_keep_the_routes_each_chunk_fed_first(engine, moe_model):
    """Sampled 3 tokens at a time, each chunk re-feeding the tokens so far as its prompt: the concatenated routes
    cover every fed position once and, the weights being unchanged, equal an unchunked forward's. The padded
    layout puts each position's routes under its token and -1 on padding and on each response's last token."""
    batch = prompts(12)
    sampler = Sampler([engine], None, RolloutConfig(max_new_tokens=10, temperature=1.0))
    generations, _ = sampler.sample_in_chunks(batch, PartialRollout(3, lambda i: 0))
    assert any(len(g.token_ids) > 3 for g in generations)  # some rows took several chunks
    fed = [p + g.token_ids[:-1] for p, g in zip(batch, generations, strict=True)]
    for g, seq, ref in zip(generations, fed, reference_routes(moe_model, fed), strict=True):
        assert g.routes.shape == (len(seq), 2, 2) and (g.routes >= 0).all()
        assert same_sets(g.routes, ref)
    from reinforce_pro.experience import layout_routes

    width = max(map(len, batch)) + max(len(g.token_ids) for g in generations)
    layout = layout_routes(list(map(len, batch)), [g.routes for g in generations], width)
    row = 5
    start = max(map(len, batch)) - len(batch[row])
    assert (layout[row, :start] == -1).all()
    assert torch.equal(layout[row, start : start + len(fed[row])], generations[row].routes)
    assert (layout[row, start + len(fed[row]) :] == -1).all()


class ThreeTurns:
    """An agent on token ids: three model turns, the environment answering the first two with three tokens."""

    async def reset(self, states):
        return {"observation_tokens": states["label"]}

    async def step(self, states):
        last = states["turn"] == 2
        return {"rewards": 0.0, "done": last, "environment_feedback_tokens": [] if last else [7, 8, 9]}


def test_an_agent_episodes_routes_are_an_fp32_forward_of_the_whole_episode(engine, moe_model):
    """Multi-turn episodes on the engine (each turn re-feeds the episode so far): every position but the last has
    the routes of the call that fed it first, and on unchanged fp32 weights they are transformers' routes of the
    whole episode in one forward, through the environment's tokens and across turns."""
    from transformers import AutoTokenizer

    from reinforce_pro.agents.episode import episodes_to_samples
    from reinforce_pro.agents.runner import AgentConfig, AgentRunner

    tokenizer = AutoTokenizer.from_pretrained(moe_model)
    sampler = Sampler([engine], tokenizer, RolloutConfig(max_new_tokens=5, temperature=1.0))
    cfg = AgentConfig(max_turns=3, max_len=90, prompt_max_len=32)
    runner = AgentRunner(ThreeTurns, tokenizer, sampler.sample, {"temperature": 1.0, "max_tokens": 5}, cfg)
    episodes = runner.run_episodes([{"prompt": f"p{i}", "label": ids} for i, ids in enumerate(prompts(6))], n=2)
    fed = [e.context()[:-1] for e in episodes]
    for e, seq, ref in zip(episodes, fed, reference_routes(moe_model, fed), strict=True):
        assert len(e.turn_ends) == 3 and e.routes.shape == (len(seq), 2, 2) and (e.routes >= 0).all()
        assert same_sets(e.routes, ref)
    samples = episodes_to_samples(episodes, 0, [""] * len(episodes), "sum")
    real = samples.attention_mask.bool()
    for row, e in enumerate(episodes):
        assert torch.equal(samples.routes[row][real[row]][:-1], e.routes)


RUN_ARGS = [
    "--vllm_dtype", "float32", "--param_dtype", "fp32", "--sft_warmup_steps", "0",
    "--rollout_batch_size", "8", "--n_samples_per_prompt", "4", "--train_batch_size", "32",
    "--micro_train_batch_size", "16", "--micro_rollout_batch_size", "32", "--actor_learning_rate", "1e-3",
    "--max_new_tokens", "6", "--max_samples", "16", "--max_len", "64", "--advantage_estimator", "reinforce_baseline",
    "--enable_vllm_is_correction", "--vllm_is_correction_type", "reinforce_pro", "--actor_num_gpus_per_node", "1",
    "--ref_num_gpus_per_node", "1", "--critic_num_gpus_per_node", "1",
]  # fmt: skip


LAYOUTS = {
    "padded": [],
    "packed": ["--packing_samples"],
    "ring": ["--packing_samples", "--ring_attn_size", "2", "--actor_num_gpus_per_node", "2"],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_run_replays_the_engines_routes_and_trains_the_balance_loss(tmp_path, engine, moe_model, layout):
    """Two steps with --routing_replay r3 --aux_loss_coef 0.001: the routes reach the trainer aligned with its
    tokens (on the same fp32 weights, at step 1, no token's experts differ between engine and trainer), the
    old forward replays them, the balance loss is logged and the policy trains; under --packing_samples the
    routes go in and come back in the packed forwards' order, and on a ring of two policy ranks each rank
    replays its block of every packed row."""
    argv = RUN_ARGS + ["--routing_replay", "r3", "--aux_loss_coef", "0.001"] + LAYOUTS[layout]
    _, cfg = parse(argv + ["--pretrain", moe_model, "--save_path", str(tmp_path / "run")])
    plan = prepare(cfg)
    history = build_and_fit(cfg, plan, engines=[engine])
    first = history[0]
    assert first["routing/flip_frac"] == 0.0 and first["routing/replayed"] == 1.0
    assert {"routing/flip_frac/layer0", "routing/flip_frac/layer1", "routing/row_flip_frac"} <= set(first)
    assert any(k.startswith("routing_pos/flip_frac/") for k in first)
    assert first["rollout/logprob_abs_diff_max"] < 1e-4  # replayed fp32 forward: the engine's numbers
    assert first["routing/logprob_abs_diff_unreplayed_mean"] < 1e-4  # no flips: replay had nothing to close
    assert "routing/logprob_abs_diff_unreplayed_mean" not in history[1]  # measured at step 1 and every 10th after
    for step in history:
        assert 1.0 < step["policy/aux_loss"] < 8.0  # 2 (the top-k) when balanced, 8 (the experts) at worst
        assert step["policy/grad_norm"] > 0
    logged = [json.loads(line) for line in (plan.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged] == [1, 2] and all("routing/flip_frac" in m for m in logged)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    assert [k for k in logged[0] if k != "step" and f"`{k}`" not in doc and not k.startswith("reward/")] == []


def test_a_synced_moe_engine_samples_as_one_that_loaded_the_weights(tmp_path, engine, moe_model):
    """New weights sent in place (the trainer's sync) must reach the CPU MoE kernel's prepacked experts: the synced
    engine samples the same tokens, log-probs and routes as a fresh engine loaded from those weights, and a second
    sync back restores the first engine's samples."""
    from safetensors.torch import save
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32)
    torch.manual_seed(2)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "experts" in name or "gate" in name:
                weight.add_(torch.randn_like(weight) * weight.std())
    other = tmp_path / "other"
    model.save_pretrained(other)
    for f in Path(moe_model).iterdir():  # the tokenizer travels with the weights
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, other / f.name)
    batch, sampling = prompts(16), dict(temperature=1.0, max_tokens=12)

    def sample(actor):  # the same random stream in every engine (a request's own seed fails on vLLM's CPU build)
        ray.get(actor.reseed.remote(7))
        return [(g.token_ids, g.log_probs, g.routes) for g in ray.get(actor.generate.remote(batch, sampling))]

    def send(state: dict) -> None:  # a tied LM head is the embedding, which is sent
        ray.get(
            engine.update_weights.remote(save({n: t.contiguous() for n, t in state.items() if n != "lm_head.weight"}))
        )

    original = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32).state_dict()
    send(original)  # whatever an earlier test trained into the shared engine
    before = sample(engine)
    send(model.state_dict())
    config = EngineConfig(model_path=str(other), dtype="float32", max_model_len=96, seed=0, capture_routes=True)
    fresh = ray.remote(VLLMEngine).options(num_cpus=1).remote(config)
    synced, loaded = sample(engine), sample(fresh)
    ray.kill(fresh)
    send(original)
    restored = sample(engine)
    for (ids, lp, routes), (ids2, lp2, routes2) in zip(synced, loaded, strict=True):
        assert ids == ids2 and torch.equal(routes, routes2)
        gaps = [abs(a - b) for a, b in zip(lp, lp2, strict=True)]
        assert max(gaps) < 1e-5, (max(gaps), lp[gaps.index(max(gaps))])
    assert any(a[0] != b[0] for a, b in zip(before, synced, strict=True))  # the new weights sample otherwise
    for (ids, lp, routes), (ids2, lp2, routes2) in zip(before, restored, strict=True):
        assert ids == ids2 and torch.equal(routes, routes2) and lp == pytest.approx(lp2, abs=1e-5)


DIGIT_REWARD = """
import torch

def reward_func(queries, prompts, labels):  # dense for an untrained model: the fraction of digits in the response
    responses = [q[len(p):] for q, p in zip(queries, prompts)]
    return torch.tensor([sum(c.isdigit() for c in r) / max(len(r), 1) for r in responses])
"""


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_an_moe_run_without_replay_measures_routing_and_trains(tmp_path, engine, moe_model, packed):
    """--routing_replay none: the trainer routes itself and still logs the disagreement, padded or packed."""
    reward = tmp_path / "digits.py"
    reward.write_text(DIGIT_REWARD)
    argv = RUN_ARGS + ["--max_samples", "8", "--remote_rm_url", str(reward)] + (["--packing_samples"] if packed else [])
    _, cfg = parse(argv + ["--pretrain", moe_model, "--save_path", str(tmp_path / "run")])
    (step,) = build_and_fit(cfg, prepare(cfg), engines=[engine])
    assert step["policy/grad_norm"] > 0 and "policy/aux_loss" not in step
    assert step["routing/flip_frac"] == 0.0 and step["routing/replayed"] == 0.0
    assert "routing/logprob_abs_diff_unreplayed_mean" not in step  # measured only beside a replayed forward


@pytest.mark.parametrize("rows", ["agent", "absolute_zero"])
def test_agent_and_self_play_runs_replay_the_engines_routes(tmp_path, engine, moe_model, rows):
    """--routing_replay r3 with agent episodes (the calculator agent, AgentInstance shape) and with self-play
    (the built-in arithmetic task, both roles): the routes reach the trainer aligned with its tokens (fp32, step
    1: no token's experts differ between engine and trainer, and replay leaves the engine's log-probs) and every
    step trains on them."""
    calculator = Path(__file__).resolve().parents[1] / "examples" / "python" / "agent_calculator.py"
    extra = {
        "agent": ["--agent_func_path", str(calculator), "--agent_max_turns", "2", "--label_key", "label"],
        "absolute_zero": ["--absolute_zero", "--max_samples", "8", "--rollout_batch_size", "4",
                          "--n_questions_per_prompt", "2"],
    }[rows]  # fmt: skip
    argv = RUN_ARGS + ["--routing_replay", "r3"] + extra
    _, cfg = parse(argv + ["--pretrain", moe_model, "--save_path", str(tmp_path / "run")])
    history = build_and_fit(cfg, prepare(cfg), engines=[engine])
    assert history and all(h["routing/replayed"] == 1.0 and "policy/grad_norm" in h for h in history)
    assert history[0]["routing/flip_frac"] == 0.0
    assert history[0]["rollout/logprob_abs_diff_max"] < 1e-4, history[0]["rollout/logprob_abs_diff_max"]


def test_lora_on_an_moe_model_trains_the_attention_adapters_with_replay(tmp_path, engine, moe_model):
    """LoRA on the MoE model under --routing_replay r3: the adapters train (only the attention projections they
    target change in the merged model; the experts and routers stay as they were), the engine serves the merged
    weights (fp32: engine and trainer agree after every sync, replay included) and the routes are replayed."""
    from safetensors.torch import load_file

    reward = tmp_path / "digits.py"
    reward.write_text(DIGIT_REWARD)
    argv = RUN_ARGS + ["--remote_rm_url", str(reward), "--routing_replay", "r3", "--lora_rank", "4", "--lora_alpha",
                       "8", "--target_modules", "q_proj", "v_proj", "--lora_save_merged"]  # fmt: skip
    _, cfg = parse(argv + ["--pretrain", moe_model, "--save_path", str(tmp_path / "run")])
    plan = prepare(cfg)
    history = build_and_fit(cfg, plan, engines=[engine])
    assert len(history) == 2 and all(h["routing/replayed"] == 1.0 for h in history)
    assert all(h["rollout/logprob_abs_diff_max"] < 1e-4 for h in history), [h["rollout/logprob_abs_diff_max"]
                                                                          for h in history]  # fmt: skip
    assert json.loads((plan.run_dir / "final_model" / "adapter_config.json").read_text())["r"] == 4
    before = load_file(Path(moe_model) / "model.safetensors")
    after = load_file(plan.run_dir / "final_model_merged" / "model.safetensors")
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), changed
