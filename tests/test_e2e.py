"""End to end on CPU: Ray + vLLM (CPU build) + DeepSpeed (CPU accelerator), a tiny local model.

One Ray cluster and one fp32 vLLM engine are shared by every test here (module fixtures); each test
builds its own policy / critic / reference actors through the real `build_and_fit`, which syncs its
policy into the shared engine before the first step.
"""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("deepspeed")
ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from reinforce_pro.cli.train_ppo_ray import parse  # noqa: E402
from reinforce_pro.models.logprobs import action_log_probs, forward_logits  # noqa: E402
from reinforce_pro.models.tiny import build_tiny_model  # noqa: E402
from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine  # noqa: E402
from reinforce_pro.run.driver import build_and_fit  # noqa: E402
from reinforce_pro.run.prepare import prepare  # noqa: E402
from reinforce_pro.trainer.checkpoint import find_latest, load_state  # noqa: E402
from reinforce_pro.trainer.logger import read_metrics  # noqa: E402
from reinforce_pro.workers.launcher import start_ray  # noqa: E402

pytestmark = pytest.mark.e2e

# Small, fast settings shared by the end-to-end runs (the built-in arithmetic prompts, exact-match reward).
BASE_ARGS = [
    "--vllm_dtype", "float32", "--param_dtype", "fp32", "--sft_warmup_steps", "0",
    "--rollout_batch_size", "8", "--n_samples_per_prompt", "4", "--train_batch_size", "32",
    "--micro_train_batch_size", "16", "--micro_rollout_batch_size", "32", "--actor_learning_rate", "1e-3",
    "--max_new_tokens", "6", "--max_samples", "24", "--actor_num_gpus_per_node", "1",
    "--critic_num_gpus_per_node", "1", "--ref_num_gpus_per_node", "1", "--max_len", "64",
]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("e2e") / "tiny", seed=0))


DIGIT_REWARD = """
import torch

def reward_func(queries, prompts, labels):
    # dense and varied for an untrained model: the fraction of digits in the response
    responses = [q[len(p):] for q, p in zip(queries, prompts)]
    return {"rewards": torch.tensor([sum(c.isdigit() for c in r) / max(len(r), 1) for r in responses]),
            "extra_logs": {"response_chars": torch.tensor([float(len(r)) for r in responses])}}
"""


@pytest.fixture(scope="module")
def digit_reward(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("reward") / "digits.py"
    path.write_text(DIGIT_REWARD)
    return str(path)


@pytest.fixture(scope="module")
def engine(tiny_model):
    start_ray(logical_cpus=8)
    actor = (
        ray.remote(VLLMEngine)
        .options(num_cpus=1)
        .remote(EngineConfig(model_path=tiny_model, dtype="float32", max_model_len=64, seed=0))
    )
    yield actor
    ray.kill(actor)
    ray.shutdown()


def run(argv, tmp_path, engine, tiny_model):
    _, cfg = parse(BASE_ARGS + argv + ["--pretrain", tiny_model, "--save_path", str(tmp_path / "run")])
    plan = prepare(cfg)
    history = build_and_fit(cfg, plan, engines=[engine])
    return cfg, plan, history


def trainer_log_probs(model_dir: str, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seq = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = forward_logits(model, seq, torch.ones_like(seq))
        lp, _ = action_log_probs(logits, seq, len(response_ids))
    return lp[0]


def test_cpu_model_ranks_start_with_freed_memory_kept(tmp_path, engine, tiny_model):
    """glibc reads KEEP_FREED_MEMORY when a process starts: the policy and reference ranks' processes must have
    it in the environment they were started with (/proc/self/environ), not set later."""
    from reinforce_pro.procs import KEEP_FREED_MEMORY
    from reinforce_pro.run.actors import build_groups

    argv = BASE_ARGS + ["--pretrain", tiny_model, "--save_path", str(tmp_path / "run"), "--init_kl_coef", "0.01"]
    _, cfg = parse(argv)  # a KL term: the run has a reference group too
    groups = build_groups(cfg, prepare(cfg), use_gpu=False, engines=[engine])

    def start_env(_worker) -> dict:
        with open("/proc/self/environ") as f:
            return dict(kv.split("=", 1) for kv in f.read().split("\0") if "=" in kv)

    try:
        assert groups.policy and groups.reference
        for actor in groups.policy + groups.reference:
            env = ray.get(actor.__ray_call__.remote(start_env))
            assert {k: env.get(k) for k in KEEP_FREED_MEMORY} == KEEP_FREED_MEMORY
    finally:
        groups.release()


def test_reinforce_pro_run_trains_syncs_and_logs(tmp_path, engine, tiny_model, digit_reward):
    cfg, plan, history = run(
        ["--advantage_estimator", "reinforce_baseline", "--enable_vllm_is_correction",
         "--vllm_is_correction_type", "reinforce_pro", "--remote_rm_url", digit_reward],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 3
    # metrics.jsonl: one object per step with the promised groups
    rows = read_metrics(plan.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert any(r["rollout/reward_std"] > 0 for r in rows)  # the reward has contrast, so there is a gradient
    expected = [
        "rollout/reward_mean", "reward/response_chars", "is/token_masked_frac", "is/prefix_is_mean", "is/vllm_kl",
        "is/ess", "policy/clip_frac", "policy/ppo_kl", "policy/grad_norm", "time/generate", "time/make_experience",
        "time/train", "time/weight_sync",
    ]  # fmt: skip
    for key in expected:
        assert all(key in r for r in rows), key
    # in fp32 the engine and the trainer agree before any update of a step
    assert all(r["rollout/logprob_abs_diff_max"] < 1e-4 for r in rows)
    assert list((plan.run_dir / "tensorboard").glob("events.*"))
    assert all("rollout_pos/logprob_abs_diff/0-1" in r for r in rows)  # the drift picture's rows...
    assert (plan.run_dir / "drift.png").read_bytes()[:4] == b"\x89PNG"  # ...and the picture

    # the final model loads back with transformers and differs from the start
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    final = plan.run_dir / "final_model"
    AutoModelForCausalLM.from_pretrained(final)
    before, after = load_file(Path(tiny_model) / "model.safetensors"), load_file(final / "model.safetensors")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) >= len(before) // 2, changed

    # weights reached the engine: its log-probs of a fresh sample match the final policy's within 1e-4
    prompt = [1, 21, 15, 27, 33]  # "<bos>1+7="... any prompt works
    gen = ray.get(engine.generate.remote([prompt] * 4, {"temperature": 1.0, "max_tokens": 6}))
    for g in gen:
        trainer = trainer_log_probs(str(final), prompt, g.token_ids)
        assert (trainer - torch.tensor(g.log_probs)).abs().max().item() < 1e-4


LORA_ARGS = ["--advantage_estimator", "reinforce_baseline", "--lora_rank", "4", "--lora_alpha", "8",
             "--target_modules", "q_proj", "v_proj", "--actor_learning_rate", "2e-2"]  # fmt: skip


def test_lora_trains_adapters_only_and_the_engine_serves_the_merged_policy(tmp_path, engine, tiny_model, digit_reward):
    cfg, plan, history = run(
        [*LORA_ARGS, "--remote_rm_url", digit_reward, "--lora_save_merged"], tmp_path, engine, tiny_model
    )
    assert len(history) == 3
    # in fp32 the engine (merged weights) and the trainer (peft model) agree after every sync
    rows = read_metrics(plan.run_dir / "metrics.jsonl")
    assert all(r["rollout/logprob_abs_diff_max"] < 1e-4 for r in rows)
    # final_model/ is the adapter in peft's format, final_model_merged/ an ordinary model directory
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    adapter, merged = plan.run_dir / "final_model", plan.run_dir / "final_model_merged"
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    assert not (adapter / "model.safetensors").exists()
    before, after = load_file(Path(tiny_model) / "model.safetensors"), load_file(merged / "model.safetensors")
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), changed  # rest frozen
    # the adapter on the base model computes what the merged model computes
    ids = torch.tensor([[1, 21, 15, 27, 33, 5, 8]])
    with torch.no_grad():
        via_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), adapter)(ids).logits
        via_merged = AutoModelForCausalLM.from_pretrained(merged)(ids).logits
    assert (via_adapter - via_merged).abs().max().item() < 1e-5
    # the engine holds the merged final policy: its log-probs of a fresh sample match within 1e-4
    prompt = [1, 21, 15, 27, 33]
    for g in ray.get(engine.generate.remote([prompt] * 4, {"temperature": 1.0, "max_tokens": 6})):
        trainer = trainer_log_probs(str(merged), prompt, g.token_ids)
        assert (trainer - torch.tensor(g.log_probs)).abs().max().item() < 1e-4


def test_lora_checkpoint_resumes_the_adapter(tmp_path, engine, tiny_model, digit_reward):
    """A LoRA run checkpointed at step 2 and resumed with nothing left to train saves exactly the adapter the
    checkpoint holds (a resume that lost the adapter would save the untrained one, B = 0)."""
    from safetensors.torch import load_file

    ckpt = tmp_path / "ckpt"
    common = [*LORA_ARGS, "--remote_rm_url", digit_reward, "--save_steps", "1", "--ckpt_path", str(ckpt),
              "--save_hf_ckpt", "--max_samples", "16"]  # fmt: skip
    run(common, tmp_path / "first", engine, tiny_model)
    saved = load_file(ckpt / "global_step2" / "policy_hf" / "adapter_model.safetensors")
    assert any("lora_B" in k and t.abs().max() > 0 for k, t in saved.items())  # trained, not the initial B = 0
    _, plan, history = run([*common, "--load_checkpoint"], tmp_path / "resumed", engine, tiny_model)
    assert history == []  # the prompt stream was used up at step 2
    resumed = load_file(plan.run_dir / "final_model" / "adapter_model.safetensors")
    assert resumed.keys() == saved.keys() and all(torch.equal(resumed[k], saved[k]) for k in saved)


@pytest.mark.parametrize(
    "backend, extra",
    [
        ("gloo", ["--zero_stage", "3", "--actor_num_gpus_per_node", "2", *LORA_ARGS]),
        ("object_store", ["--zero_stage", "3", "--actor_num_gpus_per_node", "2", "--advantage_estimator", "rloo"]),
    ],
)
def test_each_sync_backend_keeps_the_engine_on_the_trained_policy(
    tmp_path, engine, tiny_model, digit_reward, backend, extra
):
    """Weights reach the shared engine by broadcast (gloo: a process group of policy rank 0 and the engine's
    worker, rejoined by every run) or through the object store, from two ZeRO-3 ranks that gather layer by
    layer: after every sync the engine's log-probs are the trainer's, and after the run it serves the final
    policy."""
    cfg, plan, history = run(
        ["--vllm_sync_backend", backend, "--remote_rm_url", digit_reward, "--lora_save_merged" if "--lora_rank" in extra
         else "--save_hf_ckpt", *extra], tmp_path, engine, tiny_model,
    )  # fmt: skip
    started = json.loads((plan.run_dir / "config.json").read_text())  # the config the run started with
    assert len(history) == 3 and started["loop"]["sync_backend"] == backend
    assert all(r["rollout/logprob_abs_diff_max"] < 1e-4 for r in history)
    final = plan.run_dir / ("final_model_merged" if "--lora_rank" in extra else "final_model")
    from safetensors.torch import load_file

    before, after = load_file(Path(tiny_model) / "model.safetensors"), load_file(final / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained: the check below is not vacuous
    prompt = [1, 21, 15, 27, 33]
    for g in ray.get(engine.generate.remote([prompt] * 4, {"temperature": 1.0, "max_tokens": 6})):
        trainer = trainer_log_probs(str(final), prompt, g.token_ids)
        assert (trainer - torch.tensor(g.log_probs)).abs().max().item() < 1e-4


@pytest.mark.parametrize("quantization", [None, "fp8_per_channel"])
def test_a_synced_engine_samples_as_one_that_loaded_the_weights(tmp_path, engine, tiny_model, quantization):
    """An engine that loaded model A and was synced to model B samples exactly as one that loaded B. The tiny
    model ties its LM head to its embedding: on a CPU where vLLM packs the LM head's GEMM (oneDNN on AVX-512
    BF16 hosts) the reload used to leave the head packed from A ([126, 126, ...] against [33, 33, ...]).
    --vllm_quantization fp8_per_channel: the engine quantizes at load and again at every in-place reload, and
    differs from the fp32 trainer by the quantization (the mismatch the IS correction then sees)."""
    from safetensors.torch import load_file, save

    other = build_tiny_model(tmp_path / "other", seed=1)
    blob = save(load_file(Path(other) / "model.safetensors"))
    config = EngineConfig(model_path=tiny_model, dtype="bfloat16", max_model_len=64, seed=0,
                          quantization=quantization)  # fmt: skip
    synced = ray.remote(VLLMEngine).options(num_cpus=1).remote(config)
    ray.get(synced.update_weights.remote(blob))
    fresh = ray.remote(VLLMEngine).options(num_cpus=1).remote(replace(config, model_path=str(other)))
    prompt, greedy = [1, 21, 15, 27, 33], {"temperature": 0.0, "max_tokens": 6}
    (a,), (b,) = ray.get([synced.generate.remote([prompt], greedy), fresh.generate.remote([prompt], greedy)])
    for actor in (synced, fresh):
        ray.kill(actor)
    assert (a.token_ids, a.log_probs) == (b.token_ids, b.log_probs)
    gap = (trainer_log_probs(str(other), prompt, a.token_ids) - torch.tensor(a.log_probs)).abs().mean().item()
    if quantization:
        assert 1e-3 < gap < 0.5  # quantized (an fp32 engine agrees to ~1e-6), yet the same model
    else:
        assert gap < 0.05  # bf16 rounding only


def test_a_bpe_llama_with_chat_template_and_no_pad_token_trains_and_syncs(tmp_path, engine, digit_reward):
    """The pretrained-model path on a stand-in made locally (tests/bpe_model.py): byte-level BPE, ChatML
    template, EOS but no pad or BOS token, untied lm_head. Its own engine, in the shared cluster."""
    from bpe_model import build_bpe_llama

    model = build_bpe_llama(tmp_path / "llama")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"q": f"What is {a} + 3?", "a": str(a + 3)}) + "\n" for a in range(16)))
    argv = BASE_ARGS + [
        "--pretrain", str(model), "--prompt_data", str(data), "--input_key", "q", "--label_key", "a",
        "--apply_chat_template", "--remote_rm_url", digit_reward, "--advantage_estimator", "reinforce_baseline",
        "--max_samples", "16", "--samples_log_steps", "1", "--save_path", str(tmp_path / "run"),
    ]  # fmt: skip
    _, cfg = parse(argv)
    plan = prepare(cfg)
    history = build_and_fit(cfg, plan)  # engines=None: one built from the Llama, removed at the end
    assert len(history) == 2
    rows = read_metrics(plan.run_dir / "metrics.jsonl")
    assert all(r["rollout/logprob_abs_diff_max"] < 1e-4 for r in rows)  # untied lm_head synced too
    logged = [json.loads(line) for line in (plan.run_dir / "samples.jsonl").read_text().splitlines()]
    assert logged and all(s["prompt"].startswith("<|im_start|>user\nWhat is ") for s in logged)
    assert all(s["prompt"].endswith("<|im_start|>assistant\n") for s in logged)
    from safetensors.torch import load_file

    before, after = (
        load_file(model / "model.safetensors"),
        load_file(plan.run_dir / "final_model" / "model.safetensors"),
    )
    assert not torch.equal(before["lm_head.weight"], after["lm_head.weight"])  # trained as its own matrix
    assert (plan.run_dir / "final_model" / "chat_template.jinja").is_file()


def test_gae_with_critic_and_reference_one_step(tmp_path, engine, tiny_model, digit_reward):
    cfg, plan, history = run(
        ["--advantage_estimator", "gae", "--remote_rm_url", digit_reward, "--init_kl_coef", "0.01",
         "--kl_estimator", "k3", "--max_samples", "8",
         "--critic_learning_rate", "1e-3", "--save_value_network"],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert cfg.needs_critic and cfg.needs_reference
    (row,) = read_metrics(plan.run_dir / "metrics.jsonl")
    assert "critic/value_loss" in row and "critic/grad_norm" in row
    assert "kl/ref_kl_mean" in row and row["kl/ref_kl_mean"] == pytest.approx(0.0, abs=1e-6)  # policy == ref at start
    assert (plan.run_dir / "final_critic" / "value_head.safetensors").exists()
    assert len(history) == 1 and history[0]["rollout/num_samples"] == 32


@pytest.mark.parametrize("backend", ["actor", "engine"])
def test_pure_distillation_from_a_teacher_with_no_reward_function(tmp_path, engine, tiny_model, backend):
    """--prompt_data and a teacher, no reward function: the teacher's reverse KL is the only signal. A teacher of
    the same tokenizer (another initialisation), served by an actor group of its own or by a prefill-only vLLM
    engine: every step logs opd/* consistently and trains on them. Whether the student then nears its teacher is
    not asserted here: over a few steps Adam's first, sign-like updates on a near-uniform student move the reverse
    KL either way (on a fresh clone it rose at both backends); the gradient's direction is checked exactly in
    tests/test_distill.py, and learning over a whole run in docs/distillation.md."""
    teacher = build_tiny_model(tmp_path / "teacher", seed=1)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"{i % 10}+{i // 10}="}) + "\n" for i in range(24)))
    _, plan, history = run(
        ["--prompt_data", str(prompts), "--teacher.model_name_or_path", str(teacher), "--opd_task_coef", "0",
         "--init_kl_coef", "0", "--advantage_estimator", "reinforce", "--actor_learning_rate", "1e-2",
         "--teacher_backend", backend],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    rows = read_metrics(plan.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["rollout/reward_mean"] == 0.0  # no reward function: distillation alone
        assert r["opd/nonfinite_frac"] == 0.0 and r["opd/reverse_kl"] == r["opd/reverse_kl_k3"]
        assert r["opd/reverse_kl_k3"] > 0 and math.isfinite(r["opd/reverse_kl_k1"])
        assert r["opd/student_logprob_mean"] == pytest.approx(r["opd/teacher_logprob_mean"] + r["opd/reverse_kl_k1"])
        assert r["opd/advantage_mean"] == pytest.approx(-r["opd/reverse_kl_k1"])
        assert r["policy/grad_norm"] > 0  # the distillation advantage alone moved the policy
    placement = json.loads((plan.run_dir / "placement.json").read_text())
    assert len(placement["teacher"]) == 1
    assert "reference" not in placement  # --init_kl_coef 0: no reference beside the teacher
    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    assert sorted({k for r in rows for k in r if k != "step" and f"`{k}`" not in doc}) == []  # opd/*, memory/teacher0


def test_every_logged_metric_is_documented(tmp_path, engine, tiny_model, digit_reward):
    """Runs one step with a KL loss and entropy bonus, then checks docs/metrics.md names every key written."""
    _, plan, _ = run(
        ["--advantage_estimator", "rloo", "--use_kl_loss", "--kl_estimator", "k2", "--entropy_loss_coef", "0.01",
         "--enable_vllm_is_correction", "--vllm_is_correction_type", "reinforce_pro", "--max_samples", "8",
         "--remote_rm_url", digit_reward],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    (row,) = read_metrics(plan.run_dir / "metrics.jsonl")
    assert "kl/loss_kl" in row and "policy/entropy" in row
    undocumented = [k for k in row if k != "step" and f"`{k}`" not in doc and not k.startswith("reward/")]
    assert undocumented == []


@pytest.fixture(scope="module")
def tiny_reward_model(tmp_path_factory, tiny_model) -> str:
    """A randomly initialised Qwen2 sequence classifier with one output: a reward model with the HF layout."""
    from transformers import AutoConfig, Qwen2ForSequenceClassification

    from reinforce_pro.models.tiny import build_tokenizer

    path = tmp_path_factory.mktemp("rm") / "rm"
    config = AutoConfig.from_pretrained(tiny_model, num_labels=1)
    torch.manual_seed(1)
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return str(path)


def test_reward_model_directory(tmp_path, engine, tiny_model, tiny_reward_model):
    _, plan, history = run(
        ["--advantage_estimator", "rloo", "--reward_pretrain", tiny_reward_model, "--max_samples", "8"],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert plan.reward_source == f"model:{tiny_reward_model}"
    (row,) = history
    # a random classifier gives distinct real-valued scores (an exact-match reward would give 0/1)
    assert row["rollout/reward_std"] > 0 and 0 < abs(row["rollout/reward_mean"]) < 10
    assert row["rollout/reward_mean"] != round(row["rollout/reward_mean"])


def test_colocate_critic_reward_puts_the_reward_model_in_the_critics_slot(
    tmp_path, engine, tiny_model, tiny_reward_model
):
    _, plan, history = run(
        ["--advantage_estimator", "gae", "--reward_pretrain", tiny_reward_model, "--colocate_critic_reward",
         "--max_samples", "8"], tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 1 and history[0]["rollout/reward_std"] > 0 and "critic/value_loss" in history[0]
    placement = json.loads((plan.run_dir / "placement.json").read_text())
    (critic,), (reward_model,) = placement["critic"], placement["reward_model"]
    assert critic["placement_group"] is not None and reward_model["placement_group"] == critic["placement_group"]


@pytest.mark.parametrize("lag", [1, 2])
def test_rollout_staleness_lags_the_engine(tmp_path, engine, tiny_model, digit_reward, lag):
    """With --rollout_staleness K the engine samples with the policy of K steps ago: at step 1 both are the
    initial weights (fp32: agree to 1e-4); from step 2 on the trainer is ahead, and the IS filter sees a real
    mismatch. Every trained row's staleness is exactly min(step - 1, K): the treatment is set, not bounded."""
    _, plan, history = run(
        ["--advantage_estimator", "reinforce_baseline", "--rollout_staleness", str(lag), "--remote_rm_url",
         digit_reward, "--enable_vllm_is_correction", "--vllm_is_correction_type", "reinforce_pro",
         "--lr_warmup_ratio", "0"],  # with warm-up the first update has lr 0 and changes nothing
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    diffs = [h["rollout/logprob_abs_diff_max"] for h in history]
    assert diffs[0] < 1e-4
    assert all(d > 1e-3 for d in diffs[1:]), diffs
    assert abs(history[-1]["is/vllm_kl"]) > 1e-5
    staleness = [(h["async/staleness_mean"], h["async/staleness_max"]) for h in history]
    assert staleness == [(min(i, lag), min(i, lag)) for i in range(len(history))]


@ray.remote
class _NumberedPolicy:
    """A policy whose n-th serialisation is the text n: what an engine loaded says which version it holds."""

    def __init__(self):
        self.version = -1

    def state_dict_bytes(self, dtype: str) -> bytes:
        self.version += 1
        return str(self.version).encode()


@ray.remote
class _RecordingEngine:
    def __init__(self):
        self.held = None

    def update_weights(self, blob: bytes) -> int:
        self.held = int(blob)
        return 0

    def holds(self) -> int:
        return self.held


def test_an_evaluation_under_staleness_measures_the_newest_policy(engine):
    """With --rollout_staleness 2 the engines sample with the weights of 2 versions back, but an evaluation
    (held-out accuracy, --best_metric_key) measures the policy trained so far: the engines hold the newest
    weights while it runs, and the stale ones again after it."""
    from types import SimpleNamespace

    from reinforce_pro.trainer.engine_recovery import EngineRecovery
    from reinforce_pro.trainer.ppo_trainer import PPOTrainer
    from reinforce_pro.trainer.rollout_stream import EngineGate
    from reinforce_pro.trainer.weight_sync import ObjectStoreSync

    fake = _RecordingEngine.remote()
    trainer = PPOTrainer.__new__(PPOTrainer)  # only what evaluate() and sync_weights() use
    trainer.gate, trainer.weight_sync = EngineGate(), ObjectStoreSync([_NumberedPolicy.remote()], [fake], "bf16", 2)
    trainer.step, trainer.recovery = 0, EngineRecovery([fake], trainer.weight_sync, None)  # no engine restarts
    trainer.source, trainer.builder = SimpleNamespace(sampler=None), SimpleNamespace(score=None)
    trainer.eval_set = SimpleNamespace(run=lambda sampler, score: {"held": ray.get(fake.holds.remote())})
    sampled_with, evaluated = [], []
    for version in range(5):
        trainer.sync_weights(version)
        sampled_with.append(ray.get(fake.holds.remote()))
        evaluated.append(trainer.evaluate()["held"])
        assert ray.get(fake.holds.remote()) == sampled_with[-1]  # the next batch is sampled stale again
    assert sampled_with == [0, 0, 0, 1, 2] and evaluated == [0, 1, 2, 3, 4]


def test_synchronous_partial_rollouts_switch_versions_after_the_first_chunk(engine):
    """--partial_rollout with --rollout_staleness 2: after each push the engines hold, for a response's first
    chunk, the weights 3 versions back and for every later chunk those 2 back (what --rollout_staleness 2 alone
    serves); until enough versions exist, the oldest kept."""
    from reinforce_pro.trainer.rollout_stream import EngineGate
    from reinforce_pro.trainer.weight_sync import ObjectStoreSync

    fake = _RecordingEngine.remote()
    sync, gate = ObjectStoreSync([_NumberedPolicy.remote()], [fake], "bf16", 2, partial=True), EngineGate()
    chunks = []
    for version in range(6):
        sync.push(version, gate)
        assert gate.version == ray.get(fake.holds.remote())  # the push loads the first chunk's version
        per_chunk = [sync.hold_for_chunk(i) for i in range(3)]
        assert per_chunk[-1] == ray.get(fake.holds.remote())
        chunks.append(per_chunk)
    assert chunks == [[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 1, 1], [1, 2, 2], [2, 3, 3]]


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_gating",
                      "binary_kl", "--algo.advantage.is_correction_threshold", "0.05", "--algo.advantage.estimator",
                      "flash_reinforce", "--actor.loss_agg_mode", "seq-mean-token-mean"], id="openrlhf-0.11.2-flags"),
        pytest.param(["--enable_vllm_is_correction", "--vllm_is_correction_type", "cppo", "--vllm_is_anchor",
                      "rollout", "--vllm_is_correction_args", "delta=0.1", "--advantage_estimator",
                      "reinforce_baseline"], id="cppo-rollout-anchor"),
    ],
)  # fmt: skip
def test_a_rival_correction_trains(tmp_path, engine, tiny_model, digit_reward, flags):
    """An OpenRLHF 0.11.2 command line (FlashREINFORCE: its estimator and trust region, seq-binary-kl, with the
    per-sequence loss mean) and CPPO gated against the rollout policy train through the whole pipeline, with the
    engine one step behind so that the gates see a mismatch; the IS metrics are logged at every step."""
    cfg, _, history = run(
        ["--rollout_staleness", "1", "--remote_rm_url", digit_reward, "--lr_warmup_ratio", "0", *flags],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert cfg.loss.surrogate.vllm_is_correction_type in ("seq-binary-kl", "cppo")
    assert len(history) == 3 and all(h["policy/grad_norm"] > 0 for h in history)
    assert all("is/token_masked_frac" in h and math.isfinite(h["is/vllm_kl"]) for h in history)


IS_ARGS = ["--advantage_estimator", "reinforce_baseline", "--enable_vllm_is_correction", "--vllm_is_correction_type",
           "reinforce_pro", "--lr_warmup_ratio", "0"]  # fmt: skip
ASYNC = {"sync": [], "async": ["--async_train", "--async_queue_size", "2"]}


def test_partial_rollout_trains_and_logs_the_tokens_of_each_version(tmp_path, engine, tiny_model, digit_reward):
    """--partial_rollout in chunks of 2 tokens: the run trains, staleness stays within the queue, and the token
    fractions per version lag add up (which rows get mixed depends on timing; the per-token bookkeeping is
    tested deterministically in test_rollout_stream.py)."""
    _, _, history = run(
        ["--advantage_estimator", "reinforce_baseline", "--remote_rm_url", digit_reward, *ASYNC["async"],
         "--partial_rollout", "--partial_rollout_chunk", "2", "--enable_vllm_is_correction",
         "--vllm_is_correction_type", "reinforce_pro"],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 3 and all(h["policy/grad_norm"] > 0 for h in history)
    for h in history:
        assert h["async/staleness_max"] <= 2
        assert sum(h[f"async/partial_tokens_lag{d}"] for d in range(3)) == pytest.approx(1.0)
        assert 0 <= h["async/partial_mixed_rows"] <= 1


def test_synchronous_partial_rollout_sets_each_tokens_staleness(tmp_path, engine, tiny_model, digit_reward):
    """--partial_rollout --partial_rollout_chunk 2 --rollout_staleness 1, synchronous: at step 3 every
    response's first 2 tokens were sampled by version 0 (2 behind the trainer's 2) and the rest by version 1;
    steps 1 and 2 had one version to sample with (0). Set, so the fractions are exact."""
    _, _, history = run(
        ["--advantage_estimator", "reinforce_baseline", "--remote_rm_url", digit_reward, "--rollout_staleness", "1",
         "--partial_rollout", "--partial_rollout_chunk", "2", "--lr_warmup_ratio", "0"],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 3 and all(h["policy/grad_norm"] > 0 for h in history)
    lags = [[h[f"async/partial_tokens_lag{d}"] for d in range(3)] for h in history]
    assert lags[0] == [1, 0, 0] and lags[1] == [0, 1, 0], lags
    assert 0 < lags[2][2] < 1 and lags[2][1] == pytest.approx(1 - lags[2][2]), lags
    last = history[-1]
    assert last["async/staleness_max"] == 2 and last["async/partial_versions_per_row"] > 1
    assert history[0]["async/partial_versions_per_row"] == 1


def test_async_training_bounds_staleness_and_the_is_correction_sees_the_lag(tmp_path, engine, tiny_model, digit_reward):
    """--async_train --async_queue_size 2: the producer runs ahead, so rows are up to 2 policy versions stale
    (read off each row's sampling version); where they are, the trainer's and the engine's log-probs
    differ (fp32 both sides: they agree to 1e-4 when fresh) and is/vllm_kl is far above the synchronous run's."""
    argv = IS_ARGS + ["--remote_rm_url", digit_reward, "--max_samples", "48"]
    (tmp_path / "sync").mkdir()
    (tmp_path / "async").mkdir()
    _, _, sync = run(argv, tmp_path / "sync", engine, tiny_model)
    _, _, hist = run(argv + ASYNC["async"], tmp_path / "async", engine, tiny_model)
    assert len(hist) == len(sync) == 6
    assert all(h["async/staleness_max"] == 0 and "async/trainer_wait_s" not in h for h in sync)
    stale = [h["async/staleness_max"] for h in hist]
    assert stale[0] == 0 and 1 <= max(stale) <= 2, stale  # batch 1 is sampled by the initial weights
    for h in hist:
        assert h["async/staleness_mean"] == h["async/staleness_max"]  # a batch is sampled by one version
        assert (h["rollout/logprob_abs_diff_max"] > 1e-3) == (h["async/staleness_max"] > 0), h
        assert 0 <= h["async/overlap_frac"] <= 1 and h["async/trainer_wait_s"] >= 0
    kl = lambda rows: sum(abs(h["is/vllm_kl"]) for h in rows[1:]) / (len(rows) - 1)  # noqa: E731
    assert kl(hist) > 100 * max(kl(sync), 1e-7), (kl(hist), kl(sync))


NAN_AT_SECOND_CALL = """
import torch
calls = 0

def reward_func(queries, prompts, labels):
    global calls
    calls += 1
    return torch.full((len(queries),), float("nan") if calls == 2 else 0.5)
"""


@pytest.mark.parametrize("mode", list(ASYNC))
def test_a_failing_reward_function_names_the_step_after_the_done_steps_are_logged(tmp_path, engine, tiny_model, mode):
    reward = tmp_path / "nan_reward.py"
    reward.write_text(NAN_AT_SECOND_CALL)
    from reinforce_pro.rewards.loader import RewardFileError

    with pytest.raises(RewardFileError, match=r"^step 2: reward_func returned non-finite rewards at 32 of 32"):
        run(["--advantage_estimator", "reinforce_baseline", "--remote_rm_url", str(reward), *ASYNC[mode]],
            tmp_path, engine, tiny_model)  # fmt: skip
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and rows[0]["rollout/reward_mean"] == 0.5


NAN_FOR_SOME_AT_SECOND_CALL = """
import torch
calls = 0

def reward_func(queries, prompts, labels):
    global calls
    calls += 1
    rewards = torch.full((len(queries),), 0.5)
    if calls == 2:
        rewards[::4] = float("nan")
    return rewards
"""


@pytest.mark.parametrize("policy", ["zero", "drop"])
def test_reward_nan_policy_keeps_the_run_going(tmp_path, engine, tiny_model, policy):
    reward = tmp_path / "nan_reward.py"
    reward.write_text(NAN_FOR_SOME_AT_SECOND_CALL)
    run(["--advantage_estimator", "reinforce_baseline", "--remote_rm_url", str(reward), "--num_episodes", "1",
         "--reward_nan_policy", policy], tmp_path, engine, tiny_model)  # fmt: skip
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["reward/nonfinite"] for r in rows[:2]] == [0.0, 0.25]
    assert rows[1]["rollout/reward_mean"] == pytest.approx(0.5 * 0.75)  # the non-finite quarter scored 0
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))


def test_dynamic_batch_and_sleep_flags_from_openrlhf_scripts_train(tmp_path, engine, tiny_model, digit_reward, capsys):
    """OpenRLHF's scripts pass these: packed, token-budgeted micro-batches train (policy and reference), DAPO /
    ProRL length penalties are applied and logged; the sleep flags are a notice on CPU."""
    _, _, history = run(
        ["--advantage_estimator", "reinforce_baseline", "--remote_rm_url", digit_reward, "--use_dynamic_batch",
         "--packing_samples", "--init_kl_coef", "0.01", "--train_max_tokens_per_gpu", "120",
         "--rollout_max_tokens_per_gpu", "200", "--vllm_enable_sleep",
         "--deepspeed_enable_sleep", "--overlong_buffer_len", "3", "--stop_properly_penalty_coef", "0.5"],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 3 and all(h["policy/grad_norm"] > 0 for h in history)
    assert all(0 <= h["length_penalty/overlong_frac"] <= 1 and "length_penalty/truncated_frac" in h for h in history)
    out = capsys.readouterr().out
    assert "[notice] --vllm_enable_sleep: a CPU run has no device memory to free" in out
    assert "[notice] --deepspeed_enable_sleep" in out


def test_local_cluster_listens_on_loopback_only(engine, tiny_model):
    """Every TCP socket the local cluster's processes (children of this test process) listen on is loopback,
    with an engine and a two-rank DeepSpeed policy group alive."""
    psutil = pytest.importorskip("psutil")
    from reinforce_pro.workers.configs import ForwardConfig, OptimConfig
    from reinforce_pro.workers.launcher import GroupSpec, create_group, make_placement_group
    from reinforce_pro.workers.policy import PolicyLossConfig, PolicyWorker

    spec = GroupSpec("loopback_check", 1, 2)
    pg = make_placement_group(spec, use_gpu=False)
    opt = OptimConfig(learning_rate=1e-6, param_dtype="fp32", micro_batch_size=1, grad_accum_steps=1)
    fwd = ForwardConfig("sdpa", micro_batch_size=1)
    group = create_group(PolicyWorker, spec, pg, False, 1.0, lambda d: (tiny_model, opt, PolicyLossConfig(), d, 0, fwd))
    try:
        ray.get([w.parameter_checksum.remote() for w in group])  # both ranks initialised (process group up)
        ours = {p.pid for p in psutil.Process().children(recursive=True)}
        listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in ours]
        assert len(listening) >= 3  # gcs_server, raylet, workers: the check is not vacuous
        exposed = [(c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name()) for c in listening]
        assert [e for e in exposed if e[0] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")] == []
    finally:
        for w in group:
            ray.kill(w)
        ray.util.remove_placement_group(pg)


# A permissive self-play task for the untrained tiny model: every proposal is a valid question, and a
# response scores 1 when it is mostly digits, so question groups have contrast without any training.
DIGIT_TASK = """
from reinforce_pro.selfplay.tasks import ParsedQuestion, Question, ScoredResponses, SelfPlayTask

class DigitTask(SelfPlayTask):
    name = "digits"
    thresholds = {"completion": (0.5, 0.125, 0.875)}
    weights = {"completion": 1.0}

    def proposer_prompt(self, record):
        return "[" + record["input"] + "]>"

    def parse_question(self, text):
        return ParsedQuestion(Question(text[:8] + "=", ""))

    def solver_prompt(self, question):
        return question.text

    def score(self, question, responses, judge=None):
        frac = [sum(c.isdigit() for c in r) / max(len(r), 1) for r in responses]
        # the format reward goes through the llm-judge path: the policy's engine answers greedily
        verdicts = judge([question.text + r + "?" for r in responses])
        assert len(verdicts) == len(responses) and all(isinstance(v, str) for v in verdicts)
        return ScoredResponses({"completion": frac}, [float(len(v) <= 8) for v in verdicts])

TASK = DigitTask()
"""


@pytest.mark.parametrize("mode", list(ASYNC))
def test_absolute_zero_step_trains_both_roles(tmp_path, engine, tiny_model, mode):
    task = tmp_path / "digit_task.py"
    task.write_text(DIGIT_TASK)
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(f'{{"input": "{a}+{a + 1}"}}\n' for a in range(8)))
    cfg, plan, history = run(
        ["--absolute_zero", "--selfplay_task_path", str(task), "--prompt_data", str(seeds), "--max_samples", "8",
         "--rollout_batch_size", "4", "--n_questions_per_prompt", "3", "--advantage_estimator", "reinforce_baseline",
         "--enable_vllm_is_correction", "--vllm_is_correction_type", "reinforce_pro", *ASYNC[mode]],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 2
    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    for row in read_metrics(plan.run_dir / "metrics.jsonl"):
        assert row["async/staleness_max"] <= (0 if mode == "sync" or row["step"] == 1 else 2)
        sampled, integrated = row["unified_filter/num_sampled"], row["proposer/num_integrated"]
        assert integrated == 4  # sampled scope: one proposer trajectory per seed prompt
        assert row["rollout/num_samples"] == sampled * 4 + integrated  # 4 solver samples per kept question
        assert row["unified_filter/num_total"] == 3 * row["repropose/total_attempts"]
        assert 1 <= row["repropose/rounds"] <= 4
        assert row["joint/proposer_solver_ratio"] == pytest.approx(integrated / max(1, sampled * 4))
        assert "policy/grad_norm" in row and "is/token_masked_frac" in row
        assert row["selfplay/digits/format_mean"] == 1.0  # judge completions are capped at 8 tokens
        generic = [k for k in row if k != "step" and not k.startswith(("reward/", "selfplay/digits/"))]
        assert [k for k in generic if f"`{k}`" not in doc] == []
        specific = [
            re.sub(r"score_\w+_mean$", "score_<dimension>_mean", k.replace("selfplay/digits/", "selfplay/<task>/"))
            for k in row
            if k.startswith("selfplay/")
        ]
        assert specific and [k for k in specific if f"`{k}`" not in doc] == []
    assert any(row["unified_filter/num_sampled"] > 0 for row in read_metrics(plan.run_dir / "metrics.jsonl"))


def test_absolute_zero_builtin_task_evaluates_its_ladder_and_proposes_from_references(tmp_path, engine, tiny_model):
    """Through the trainer: the open-ended arithmetic task on its built-in seeds, the held-out ladder
    (every level) before training and every step, the reference buffer and the repetition penalty."""
    from reinforce_pro.selfplay.builtin_tasks import LADDER_LEVELS

    cfg, plan, history = run(
        ["--absolute_zero", "--max_samples", "8", "--rollout_batch_size", "4", "--n_questions_per_prompt", "3",
         "--advantage_estimator", "reinforce_baseline", "--eval_steps", "1", "--eval_before_training",
         "--selfplay_reference_buffer", "8", "--proposer_repetition_penalty", "8", "--max_new_tokens", "20"],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 2 and cfg.selfplay.config.repetition_penalty == 8.0
    rows = read_metrics(plan.run_dir / "metrics.jsonl")
    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    ladder = [row for row in rows if "eval/ladder/accuracy_mean" in row]
    assert [row["step"] for row in ladder] == [0, 1, 2]
    levels = [k for k in ladder[0] if k.startswith("eval/ladder/") and k.endswith("/accuracy")]
    assert set(levels) == {f"eval/ladder/{level}/accuracy" for level in LADDER_LEVELS}
    assert all(0.0 <= ladder[0][k] <= 1.0 for k in levels)
    assert "`eval/ladder/<level>/accuracy`" in doc and "`eval/ladder/accuracy_mean`" in doc
    for row in (r for r in rows if r["step"] > 0 and "unified_filter/num_total" in r):
        assert 0.0 <= row["proposer/reference_frac"] <= 1.0 and row["proposer/reference_buffer_size"] <= 8
        # curriculum metrics describe valid proposals: an untrained model may write none
        assert ("selfplay/arithmetic/proposal_unique_frac" in row) == (row["selfplay/arithmetic/valid_ratio"] > 0)
        assert row["proposer/reference_buffer_size"] > 0 or row["proposer/reference_frac"] == 0.0
        assert "`proposer/reference_frac`" in doc and "`proposer/reference_buffer_size`" in doc


def test_absolute_zero_with_an_sdk_solver_trains_through_the_endpoint(tmp_path, engine, tiny_model):
    """--absolute_zero --agent_func_path an OpenAI-SDK agent: the calculator agent answers every solver question
    (training and the held-out ladder) through the run's loopback endpoint on the real engine: none failed, none
    forked (completions extend). The untrained model makes few questions learnable, so which episodes train is
    left to chance: where some did, their turns and tool calls are logged."""
    pytest.importorskip("openai")
    from reinforce_pro.selfplay.builtin_tasks import LADDER_LEVELS, LADDER_QUESTIONS

    calculator = Path(__file__).resolve().parents[1] / "examples" / "python" / "agent_calculator_openai.py"
    cfg, plan, history = run(
        ["--absolute_zero", "--agent_func_path", str(calculator), "--max_samples", "8", "--rollout_batch_size", "4",
         "--n_questions_per_prompt", "2", "--advantage_estimator", "reinforce_baseline", "--eval_steps", "2",
         "--eval_before_training", "--max_new_tokens", "20"],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 2
    rows = read_metrics(plan.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows if "eval/ladder/accuracy_mean" in r] == [0, 2]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    trained = [r for r in rows if "unified_filter/num_total" in r]
    assert len(trained) == 2
    # step 1 counts the step-0 ladder's episodes (one per held-out question) beside its own solver episodes
    assert trained[0]["agent/episodes"] >= len(LADDER_LEVELS) * LADDER_QUESTIONS
    for row in trained:
        assert row["agent/failed_episodes"] == 0 and row["agent/segment_forks"] == 0
        if "agent/turns_mean" in row:  # some solver episodes trained
            assert 1 <= row["agent/turns_mean"] <= 4 and 0 <= row["agent/env_token_frac"] < 1
            assert 0.0 <= row["selfplay/arithmetic/solver_tool_calls_mean"] <= 4.0
        assert "policy/grad_norm" in row
        generic = [k for k in row if k.startswith("agent/")]
        assert [k for k in generic if f"`{k}`" not in doc] == []


def test_absolute_zero_code_task_runs_through_the_trainer(tmp_path, engine, tiny_model):
    """The code task on its built-in seeds: proposals parsed (and, when they call f, run in the sandbox),
    each role sampled under its own budget capped by --max_new_tokens (a 128-token program would not fit the
    tiny engine's 64), the code ladder evaluated before training and every step. The tiny model writes no
    valid program; the measured run on SmolLM2 is in docs/selfplay.md."""
    cfg, plan, history = run(
        ["--absolute_zero", "--selfplay_task", "code_output", "--max_samples", "4", "--rollout_batch_size", "2",
         "--n_questions_per_prompt", "2", "--max_repropose_attempts", "1", "--proposer_train_scope", "group",
         "--advantage_estimator", "reinforce_baseline", "--eval_steps", "1", "--eval_before_training",
         "--max_new_tokens", "24", "--prompt_max_len", "32"],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 2
    rows = read_metrics(plan.run_dir / "metrics.jsonl")
    ladder = [row for row in rows if "eval/ladder/accuracy_mean" in row]
    assert [row["step"] for row in ladder] == [0, 1, 2]
    assert {k for k in ladder[0] if k.endswith("/accuracy")} == {
        f"eval/ladder/{level}/accuracy" for level in ("arith", "branch", "string", "list", "loop")
    }
    for row in (r for r in rows if r["step"] > 0 and "unified_filter/num_total" in r):
        assert row["unified_filter/num_total"] == 2 * row["repropose/total_attempts"]
        assert 0.0 <= row["selfplay/code_output/valid_ratio"] <= 1.0
        assert row["rollout/response_length_mean"] <= 24


@pytest.mark.recipe
def test_the_absolute_zero_code_recipe_runs_on_smollm2(tmp_path, engine):
    """Examples/scripts/train_absolute_zero_code.sh end to end on a real model at a tiny budget (one
    step of 2 seed prompts, 2 questions each, 2 answers per question, an eager engine), in this session's Ray
    cluster: SmolLM2-135M-Instruct prepared from its package, proposals run in the kernel-confined sandbox,
    the code ladder evaluated before and after the step. The measured run is in docs/selfplay.md."""
    pytest.importorskip("gguf")  # the models extra prepares SmolLM2 from its GGUF package
    script = Path(__file__).resolve().parents[1] / "examples" / "scripts" / "train_absolute_zero_code.sh"
    tiny = "--n_questions_per_prompt 2 --n_samples_per_prompt 2 --max_repropose_attempts 0 --enforce_eager"
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONWARNINGS": "ignore",
           "PYTHON": sys.executable, "OUT": str(tmp_path / "run"), "STEPS": "1", "PROMPTS_PER_STEP": "2",
           "EVAL_STEPS": "1", "EXTRA_ARGS": tiny}  # fmt: skip
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=900)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "[self-play] sandbox layers: rlimits" in log
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    kinds = ("arith", "branch", "string", "list", "loop")
    assert all(0.0 <= r[f"eval/ladder/{kind}/accuracy"] <= 1.0 for r in rows for kind in kinds)
    assert rows[1]["unified_filter/num_total"] == 4 and 0.0 <= rows[1]["selfplay/code_output/valid_ratio"] <= 1.0


# ------------------------------------------------------------------ running it for real

HELD_OUT = "".join(f'{{"input": "{a}+{b}=", "label": "{a + b}"}}\n' for a, b in [(1, 2), (3, 4), (5, 6), (7, 1)])


@pytest.mark.parametrize("mode", list(ASYNC))
def test_eval_filtering_wandb_samples_and_checkpoints(tmp_path, engine, tiny_model, digit_reward, monkeypatch, mode):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(HELD_OUT)
    ckpt = tmp_path / "ckpt"
    cfg, plan, history = run(
        ["--advantage_estimator", "reinforce_baseline", "--remote_rm_url", digit_reward, "--label_key", "label",
         "--eval_dataset", str(held_out), "--eval_steps", "2", "--eval_before_training",
         "--eval_n_samples_per_prompt", "3", "--dynamic_filtering", "--dynamic_filtering_reward_range", "0.05", "0.95",
         "--use_wandb", "offline", "--wandb_project", "e2e", "--samples_log_steps", "2",
         "--save_steps", "1", "--ckpt_path", str(ckpt), "--max_ckpt_num", "2", "--save_hf_ckpt",
         "--max_samples", "40", "--best_metric_key", "score_mean", *ASYNC[mode]],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    rows = read_metrics(plan.run_dir / "metrics.jsonl")
    steps = [r["step"] for r in rows]
    last = steps[-1]  # top-ups consume the stream faster: the run ends when it runs out
    assert last >= 2 and steps == list(range(0, last + 1))  # step 0: the evaluation before training
    for r in rows:
        if r["step"] % 2 == 0:
            assert r["eval/held_out/num_prompts"] == 4 and 0.0 <= r["eval/held_out/pass@3"] <= 1.0
            assert r["eval/held_out/pass@3"] >= r["eval/held_out/score_mean"]
        else:
            assert "eval/held_out/pass@3" not in r
    for r in rows[1:]:
        assert 0 < r["dynamic_filtering/pass_rate"] <= 1 and r["dynamic_filtering/groups_kept"] <= 8
        assert r["rollout/num_samples"] == 4 * r["dynamic_filtering/groups_kept"]
    consumed = [json.loads(line) for line in (plan.run_dir / "consumed.jsonl").read_text().splitlines()]
    assert [c["step"] for c in consumed] == list(range(1, last + 1))
    assert all(len(c["prompts"]) >= 8 for c in consumed)
    assert sum(len(c["prompts"]) for c in consumed) <= 40
    samples = [json.loads(line) for line in (plan.run_dir / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == set(range(2, last + 1, 2))
    assert all(isinstance(s["reward"], float) for s in samples)
    assert list((plan.run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    # checkpoints: the newest two, each complete, `latest` naming the last
    assert [d.name for d in sorted(ckpt.glob("global_step*"))] == [f"global_step{last - 1}", f"global_step{last}"]
    assert (ckpt / "latest").read_text().strip() == f"global_step{last}"
    assert (ckpt / f"global_step{last}" / "policy_hf" / "config.json").is_file()
    state = json.loads((ckpt / f"global_step{last}" / "trainer_state.json").read_text())
    assert state["step"] == last and state["loader"]["position"] == sum(len(c["prompts"]) for c in consumed)
    # --best_metric_key: best_model/ holds the policy of the first evaluation with the highest score_mean, and
    # the checkpoint remembers it (a resume must not overwrite it with a worse one)
    evaluated = [(r["eval/held_out/score_mean"], -r["step"]) for r in rows if "eval/held_out/score_mean" in r]
    value, minus_step = max(evaluated)
    best = json.loads((plan.run_dir / "best_model" / "best.json").read_text())
    assert best == {"step": -minus_step, "key": "eval/held_out/score_mean", "value": value}
    assert (plan.run_dir / "best_model" / "model.safetensors").is_file()
    assert state["best"] == best
    # ...and keeps the model itself, which a resume from it puts back (trainer/best_model.py, test_best_model.py)
    kept = ckpt / f"global_step{last}" / "best_model"
    assert json.loads((kept / "best.json").read_text()) == best and (kept / "model.safetensors").is_file()


RESUME_ARGS = ["--advantage_estimator", "reinforce_baseline", "--save_steps", "1", "--max_samples", "40",
               "--max_ckpt_num", "5", "--seed", "5"]  # fmt: skip


@pytest.mark.parametrize("mode", list(ASYNC))
def test_sigkill_mid_step_then_resume_consumes_the_same_prompts(tmp_path, engine, tiny_model, digit_reward, mode,
                                                               capsys):  # fmt: skip
    """A run killed with SIGKILL during step 3 and resumed with --load_checkpoint trains on exactly the
    prompts of an uninterrupted run with the same seed, steps continuing and metrics appended. Under
    --async_train the producer has taken prompts for later batches when the run dies: they are regenerated
    (the checkpoint keeps the prompt stream as it was after the last trained batch), none trained twice."""
    argv = RESUME_ARGS + ["--remote_rm_url", digit_reward, *ASYNC[mode]]
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    _, ref_plan, _ = run(argv + ["--ckpt_path", str(tmp_path / "ref_ckpt")], reference_dir, engine, tiny_model)
    want = (ref_plan.run_dir / "consumed.jsonl").read_text()

    run_dir, ckpt = tmp_path / "killed" / "run", tmp_path / "killed_ckpt"
    cmd = [sys.executable, "-m", "reinforce_pro.cli.train_ppo_ray", *BASE_ARGS, *argv, "--pretrain", tiny_model,
           "--save_path", str(run_dir), "--ckpt_path", str(ckpt)]  # fmt: skip
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONWARNINGS": "ignore"}
    log = tmp_path / "killed.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not _rows(run_dir / "consumed.jsonl") >= 3:  # step 3 has taken its prompts: it is mid-step
            alive = proc.poll() is None and time.monotonic() < deadline
            assert alive, f"the run ended before it could be killed:\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver's own session: only what this test started
        proc.wait()
    killed_at = find_latest(ckpt)
    assert killed_at is not None and load_state(killed_at)["step"] in (2, 3)

    resume_dir = tmp_path / "killed"
    capsys.readouterr()
    cfg, plan, history = run(argv + ["--ckpt_path", str(ckpt), "--load_checkpoint"], resume_dir, engine, tiny_model)
    assert f"[resume] from {killed_at} at step {load_state(killed_at)['step']}" in capsys.readouterr().out
    assert [h["step"] for h in history] == [1, 2, 3, 4, 5]  # the whole history, the killed run's steps included
    assert (plan.run_dir / "consumed.jsonl").read_text() == want
    assert [r["step"] for r in read_metrics(plan.run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5]


def test_the_driver_killed_mid_run_is_resumed_by_running_its_command_again(tmp_path, engine, tiny_model, digit_reward):
    """A probe SIGKILLs the driver itself (its whole session: nothing of it can say anything) once step 3 is
    logged; the same command, run again, finds its run in --save_path and resumes it from the newest checkpoint:
    it ends 0, every step is in metrics.jsonl once, and no traceback is printed."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "reinforce_pro.cli.train_ppo_ray", *BASE_ARGS, *RESUME_ARGS, "--remote_rm_url",
           digit_reward, "--pretrain", tiny_model, "--save_path", str(run_dir),
           "--ckpt_path", str(tmp_path / "c")]  # fmt: skip
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONWARNINGS": "ignore"}
    with open(tmp_path / "killed.log", "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while _rows(run_dir / "metrics.jsonl") < 3:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "killed.log").read_text()[-3000:]
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver's own session: only what this test started
        proc.wait()
    saved = find_latest(tmp_path / "c")
    assert saved is not None
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text[-3000:]
    assert f"holds this command's run: resuming it from {tmp_path / 'c'}" in text and "Traceback" not in text
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    summary = json.loads((run_dir / "summary.json").read_text())  # from every row, the killed run's included
    rewards = [r["rollout/reward_mean"] for r in rows]
    assert summary["steps"] == 5 and summary["reward_first5"] == pytest.approx(sum(rewards) / 5)


def _rows(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _pid(run_dir: Path, role: str) -> int | None:
    """The process id of the run's first `role` actor as placement.json names it (rewritten at every start)."""
    try:
        return json.loads((run_dir / "placement.json").read_text())[role][0]["pid"]
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _run_with_faults(tmp_path: Path, argv: list[str], faults: list[tuple[str, int, int]]) -> tuple[str, list[int]]:
    """train_ppo_ray with `argv` in a session of its own; for each (role, steps, signal) of `faults` in turn, once
    `steps` steps are logged, `signal` goes to the run's first `role` actor (by its pid in placement.json: one of
    the run's own processes). Asserts the run ends 0 within 8 minutes; returns its output and the signalled
    processes still there when it ended (which this test then ends: only what it signalled)."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "reinforce_pro.cli.train_ppo_ray", *argv, "--save_path", str(run_dir)]
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONWARNINGS": "ignore"}
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    signalled, left = [], []
    try:
        deadline = time.monotonic() + 480
        for role, after_step, sig in faults:
            while True:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                pid = _pid(run_dir, role)
                if _rows(run_dir / "metrics.jsonl") >= after_step and pid and pid not in signalled:
                    os.kill(pid, sig)
                    signalled.append(pid)
                    break
                time.sleep(0.05)
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver's own session: only what this test started
            proc.wait()
        left = [pid for pid in signalled if _alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    return log.read_text(), left


FAULT_ARGS = ["--advantage_estimator", "reinforce_baseline", "--save_steps", "2", "--enforce_eager"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_recovers_from_its_engine_and_its_policy_killed_mid_run(tmp_path, engine, tiny_model, digit_reward, mode):
    """A probe outside the run SIGKILLs the run's own vLLM engine once step 2 is logged, then its policy rank
    once step 5 is: the engine is started again in place with the current weights (synchronous; under
    --async_train the run's actors restart from the newest checkpoint), the policy's loss starts the run's actors
    again from the newest checkpoint; the run ends 0, logs every step once (none repeated or skipped), and
    prints no traceback; each loss is one [recover] line."""
    argv = [*BASE_ARGS, *FAULT_ARGS, "--remote_rm_url", digit_reward, "--max_samples", "64", "--ckpt_path",
            str(tmp_path / "ckpt"), "--pretrain", tiny_model, *ASYNC[mode]]  # fmt: skip
    text, _ = _run_with_faults(tmp_path, argv, [("engines", 2, signal.SIGKILL), ("policy", 5, signal.SIGKILL)])
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == list(range(1, 9)), text[-3000:]
    recovered = re.findall(r"\[recover\] (.*)", text)
    assert len(recovered) == 2 and "vLLM engine 0 was lost" in recovered[0], recovered
    # synchronous: the engine replaced in place (its weight group formed again); under --async_train the gloo
    # broadcast cannot give a new engine the weights the others hold: the run restarts from its checkpoint
    in_place = "a new vLLM engine 0 takes the weights the others hold" in recovered[0]
    assert in_place == (mode == "sync") and (in_place or "global_step" in recovered[0]), recovered
    assert "policy rank 0 was lost" in recovered[1] and "global_step" in recovered[1], recovered
    assert "Traceback" not in text and (tmp_path / "run" / "final_model").is_dir()


def test_a_run_recovers_from_a_hung_engine(tmp_path, engine, tiny_model, digit_reward):
    """A probe stops the run's own vLLM engine (SIGSTOP: alive to Ray, answering nothing) once step 2 is logged:
    the next call on it outlasts --engine_timeout_s, the run kills the stopped engine and starts a new one in its
    place with the current weights, and the call runs again; it ends 0 with every step logged once (none run
    twice: no restart from a checkpoint), one [recover] line naming the hung engine and no traceback."""
    argv = [*BASE_ARGS, *FAULT_ARGS, "--remote_rm_url", digit_reward, "--max_samples", "48", "--ckpt_path",
            str(tmp_path / "ckpt"), "--engine_timeout_s", "15", "--pretrain", tiny_model]  # fmt: skip
    text, left = _run_with_faults(tmp_path, argv, [("engines", 2, signal.SIGSTOP)])
    assert left == [], "the run left its hung engine behind"
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 7)), text[-3000:]
    recovered = re.findall(r"\[recover\] (.*)", text)
    assert len(recovered) == 1 and "vLLM engine 0 hung at step 3: no answer to a" in recovered[0], recovered
    assert "in 15 s (--engine_timeout_s); a new vLLM engine 0 takes the weights" in recovered[0], recovered
    assert [r["faults/engine_restarts"] for r in rows] == [0, 0, 1, 1, 1, 1]  # no step run twice
    assert "Traceback" not in text and (tmp_path / "run" / "final_model").is_dir()


def test_a_memory_hog_that_makes_rays_monitor_kill_an_actor_costs_the_run_nothing(tmp_path, tiny_model, digit_reward):
    """A run on a Ray cluster of its own whose memory monitor acts 6 GB above the node's use at its start; once
    step 3 is logged, this test (a neighbour, not one of Ray's workers) takes memory until the node is 0.5 GB past
    that line, and gives it back as soon as one of the run's actors is gone. The monitor kills one; the run names
    it (killed by Ray's memory monitor) in one [recover] line, goes on, and ends 0 with every step once."""
    import numpy as np
    import psutil

    node = psutil.virtual_memory()
    line = (node.total - node.available + 6 * 2**30) / node.total
    if line > 0.9:
        pytest.skip(f"the node has too little free memory for the hog ({node.available / 2**30:.1f} GB available)")
    run_dir = tmp_path / "run"
    argv = [
        *BASE_ARGS,
        *FAULT_ARGS,
        "--remote_rm_url",
        digit_reward,
        "--max_samples",
        "192",
        "--ckpt_path",
        str(tmp_path / "ckpt"),
        "--pretrain",
        tiny_model,
        "--save_path",
        str(run_dir),
    ]  # fmt: skip  (24 steps)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a cluster of its own, with its own monitor
    env.update(RAY_memory_usage_threshold=f"{line:.4f}", RAY_memory_monitor_refresh_ms="100", PYTHONWARNINGS="ignore")
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "reinforce_pro.cli.train_ppo_ray", *argv], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    hog = []  # the neighbour's memory
    try:
        deadline = time.monotonic() + 480
        while _rows(run_dir / "metrics.jsonl") < 3:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        pids = [a["pid"] for actors in json.loads((run_dir / "placement.json").read_text()).values() for a in actors]
        now = psutil.virtual_memory()
        hog.append(np.ones(int(line * now.total - (now.total - now.available) + 2**29), dtype=np.uint8))  # resident
        while all(_alive(pid) for pid in pids):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
        hog.clear()  # one actor is gone: the neighbour leaves
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, log.read_text()[-3000:]
    finally:
        hog.clear()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver's own session: only what this test started
            proc.wait()
    text = log.read_text()
    recovered = re.findall(r"\[recover\] (.*)", text)
    assert recovered and "killed by Ray's memory monitor (node memory " in recovered[0], text[-3000:]
    assert re.match(r"(vLLM engine|policy rank|reference rank) 0 was lost", recovered[0]), recovered  # named
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == list(range(1, 25)), text[-3000:]
    assert "Traceback" not in text


def _alive(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has: it only waits for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------ multi-turn agents


AGENT_ASYNC = {**ASYNC, "async-partial": [*ASYNC["async"], "--partial_rollout", "--partial_rollout_chunk", "2"]}


@pytest.mark.parametrize("mode", list(AGENT_ASYNC))
def test_calculator_agent_run(tmp_path, engine, tiny_model, mode):
    calculator = Path(__file__).resolve().parents[1] / "examples" / "python" / "agent_calculator.py"
    cfg, plan, history = run(
        ["--agent_func_path", str(calculator), "--agent_max_turns", "3", "--advantage_estimator", "reinforce_baseline",
         "--enable_vllm_is_correction", "--vllm_is_correction_type", "reinforce_pro", "--max_samples", "16",
         "--label_key", "label", *AGENT_ASYNC[mode]],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 2
    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    for row in read_metrics(plan.run_dir / "metrics.jsonl"):
        assert 1 <= row["agent/turns_mean"] <= 3
        assert 0 < row["agent/env_token_frac"] < 1  # the untrained model writes non-answers: the tool replies
        assert "is/token_masked_frac" in row and "policy/grad_norm" in row
        documented = [re.sub(r"_lag\d+$", "_lag<d>", k) for k in row]  # one doc row names every lag d
        assert [k for k in documented if k != "step" and f"`{k}`" not in doc and not k.startswith("reward/")] == []
        if mode == "async-partial":  # episodes sampled in chunks of 2 tokens, weight syncs let in between
            assert sum(row[f"async/partial_tokens_lag{d}"] for d in range(3)) == pytest.approx(1.0)
    steps = [json.loads(line) for line in (plan.run_dir / "agent_steps.jsonl").read_text().splitlines()]
    assert len(steps) == 2 * 8 * 4  # one row per episode: 8 prompts x 4 samples per step
    spans = steps[0]["step_meta"]["turn_spans"]
    assert spans[0][2] == "model" and all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert {s["step_meta"]["group_id"] for s in steps if s["step"] == 1} == set(range(8))


@pytest.mark.parametrize("mode", list(AGENT_ASYNC))
def test_calculator_written_to_the_openai_sdk_trains(tmp_path, engine, tiny_model, mode):
    """examples/python/agent_calculator_openai.py: the agent calls the run's loopback endpoint through the openai
    client (synchronously, or from the producer thread of --async_train while the trainer syncs weights); its
    episodes train like the AgentInstance twin's (tests/test_openai_agents.py compares the rows)."""
    pytest.importorskip("openai")
    calculator = Path(__file__).resolve().parents[1] / "examples" / "python" / "agent_calculator_openai.py"
    cfg, plan, history = run(
        ["--agent_func_path", str(calculator), "--advantage_estimator", "reinforce_baseline", "--max_samples", "16",
         "--enable_vllm_is_correction", "--vllm_is_correction_type", "reinforce_pro", "--label_key", "label",
         *AGENT_ASYNC[mode]],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 2
    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    for row in read_metrics(plan.run_dir / "metrics.jsonl"):
        if mode == "async-partial":  # requests sampled in chunks of 2 tokens, weight syncs let in between
            assert sum(row[f"async/partial_tokens_lag{d}"] for d in range(3)) == pytest.approx(1.0)
        row = {re.sub(r"_lag\d+$", "_lag<d>", k): v for k, v in row.items()}  # one doc row names every lag d
        assert row["agent/episodes"] == 8 * 4 and row["agent/dropped_episodes"] == 0
        assert 1 <= row["agent/calls_mean"] <= 4 and row["agent/segment_forks"] == 0  # completions extend as text
        assert 0 < row["agent/env_token_frac"] < 1 and "is/token_masked_frac" in row and "policy/grad_norm" in row
        assert [k for k in row if k != "step" and f"`{k}`" not in doc and not k.startswith("reward/")] == []


FAILS_AT_SECOND_STEP = """
calls = 0

async def run_agent(client, prompt, label):
    global calls
    calls += 1
    if calls > 32:  # every episode of the second step
        raise KeyError("the tool's service is down")
    reply = await client.completions.create(model="policy", prompt=prompt)
    return {"reward": 0.5}
"""


def test_an_agent_whose_every_episode_fails_names_the_step_after_the_done_steps_are_logged(
    tmp_path, engine, tiny_model
):
    """An SDK agent that fails every episode of step 2: the run stops with its file, the step and the first
    error in one message (the command line prints it as one line), and step 1 is in metrics.jsonl."""
    pytest.importorskip("openai")
    from reinforce_pro.agents.contract import AgentFileError

    agent = tmp_path / "failing_agent.py"
    agent.write_text(FAILS_AT_SECOND_STEP)
    want = rf"^--agent_func_path {agent}: step 2: all 32 episodes of the step failed; the first: run_agent raised "
    with pytest.raises(AgentFileError, match=want + "KeyError"):
        run(["--agent_func_path", str(agent), "--advantage_estimator", "reinforce_baseline", "--max_samples", "16",
             "--label_key", "label"], tmp_path, engine, tiny_model)  # fmt: skip
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1]


def test_a_tool_calling_agent_trains_on_the_engine(tmp_path, engine, tiny_model):
    """examples/python/agent_calculator_tools.py (the OpenAI guide's tool loop, `tools=` on the chat route): the
    tools are rendered into every episode's prompt, the replies are read for calls, and the run trains and logs
    the tool metrics docs/metrics.md names."""
    pytest.importorskip("openai")
    agent = Path(__file__).resolve().parents[1] / "examples" / "python" / "agent_calculator_tools.py"
    cfg, plan, history = run(
        ["--agent_func_path", str(agent), "--advantage_estimator", "reinforce_baseline", "--max_samples", "8",
         "--label_key", "label"],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    (row,) = read_metrics(plan.run_dir / "metrics.jsonl")
    assert row["agent/episodes"] == 8 * 4 and row["agent/dropped_episodes"] == 0 and "policy/grad_norm" in row
    assert row["agent/tool_calls_mean"] >= 0 and row["agent/tool_call_failures"] >= 0
    assert [k for k in row if k != "step" and f"`{k}`" not in doc and not k.startswith("reward/")] == []


@pytest.mark.parametrize(("shape", "mode"), [("agent_calculator.py", "sync"),
                                           ("agent_calculator_openai.py", "async-partial")])  # fmt: skip
def test_an_agent_run_evaluates_held_out_episodes(tmp_path, engine, tiny_model, shape, mode):
    """--eval_dataset with --agent_func_path: step 0 and the last step log eval/<dataset>/* over the agent's
    held-out episodes, in the AgentInstance shape and in the SDK shape while chunked training episodes are in
    flight (the held-out ones use an endpoint of their own)."""
    pytest.importorskip("openai")
    from reinforce_pro.data.arithmetic import arithmetic_records

    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_records(4, seed=1234)))
    agent = Path(__file__).resolve().parents[1] / "examples" / "python" / shape
    cfg, plan, history = run(
        ["--agent_func_path", str(agent), "--advantage_estimator", "reinforce_baseline", "--max_samples", "16",
         "--label_key", "label", "--eval_dataset", str(held), "--eval_n_samples_per_prompt", "2", "--eval_steps",
         "2", "--eval_before_training", *AGENT_ASYNC[mode]],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    evals = [r for r in read_metrics(plan.run_dir / "metrics.jsonl") if "eval/held/score_mean" in r]
    assert [r["step"] for r in evals] == [0, 2]
    for r in evals:
        assert r["eval/held/num_prompts"] == 4 and 0 <= r["eval/held/score_mean"] <= r["eval/held/pass@2"] <= 1
        assert r["eval/held/response_length_mean"] >= 1  # every episode sampled at least one token
        if shape == "agent_calculator_openai.py":  # its run_agent's extra_logs, averaged
            assert 0 <= r["eval/held/logs/tool_calls"] <= 4


def test_openai_endpoint_rows_are_the_engines_ids_bit_for_bit(engine, tiny_model):
    """The real engine behind the endpoint: every trained row is exactly the ids each call gave the engine and
    the ids (and log-probs) it sampled, the SDK's text in between never re-tokenised into the sample."""
    pytest.importorskip("openai")
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from reinforce_pro.agents.agent_file import load_agent
    from reinforce_pro.agents.openai_agents import OpenAIAgentSource
    from reinforce_pro.agents.runner import AgentConfig
    from reinforce_pro.rollout.sampler import RolloutConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    given, sampled = [], []

    def sample(prompts, sampling):
        out = ray.get(engine.generate.remote(prompts, sampling))
        given.extend(prompts)
        sampled.extend(out)
        return out

    calculator = Path(__file__).resolve().parents[1] / "examples" / "python" / "agent_calculator_openai.py"
    cfg = RolloutConfig(max_new_tokens=8)
    source = OpenAIAgentSource(SimpleNamespace(cfg=cfg, tokenizer=tokenizer, sample=sample), load_agent(calculator),
                               AgentConfig(max_len=64))  # fmt: skip
    try:
        samples = source.generate([{"prompt": f"{a}+{a + 1}=", "label": str(2 * a + 1)} for a in range(1, 5)], 4)
    finally:
        source.close()
    assert samples.metrics["agent/segment_forks"] == 0 and len(sampled) == samples.metrics["agent/calls_mean"] * 16
    t = samples.num_actions
    for row in range(16):
        ids = samples.sequences[row][samples.attention_mask[row] == 1].tolist()
        calls = [k for k, g in enumerate(given) if ids[: len(g)] == g and ids[len(g) :][: len(sampled[k].token_ids)]
                 == sampled[k].token_ids]  # fmt: skip
        last = max(calls, key=lambda k: len(given[k]))
        assert ids == given[last] + sampled[last].token_ids  # the row ends with the last call, exactly
        prompt_len = int(samples.attention_mask[row, :-t].sum())
        lp, act = samples.rollout_log_probs[row], samples.action_mask[row]
        for k in calls:  # every call's sampled ids sit at their place, trained, with the engine's log-probs
            start = len(given[k]) - prompt_len
            n = len(sampled[k].token_ids)
            assert act[start : start + n].all()
            torch.testing.assert_close(lp[start : start + n], torch.tensor(sampled[k].log_probs), rtol=0, atol=0)
        assert int(act.sum()) == sum(len(sampled[k].token_ids) for k in calls)  # and nothing else is trained


@pytest.mark.parametrize("agent", ["agent_calculator.py", "agent_calculator_openai.py"])
def test_agent_run_with_dynamic_filtering_filters_on_the_environments_rewards(tmp_path, engine, tiny_model, agent):
    """OpenRLHF's agent scripts pass --dynamic_filtering: groups are kept by the environment's scores (there is
    no reward function to call), in either agent shape. A range that keeps every group: two steps of 8 groups,
    all kept."""
    calculator = Path(__file__).resolve().parents[1] / "examples" / "python" / agent
    turns = ["--agent_max_turns", "2"] if agent == "agent_calculator.py" else []  # the SDK file counts its own
    _, plan, history = run(
        ["--agent_func_path", str(calculator), *turns, "--advantage_estimator", "reinforce_baseline",
         "--max_samples", "16", "--label_key", "label", "--dynamic_filtering", "--dynamic_filtering_reward_range",
         "-1", "2"],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 2
    for row in read_metrics(plan.run_dir / "metrics.jsonl"):
        assert (row["dynamic_filtering/pass_rate"], row["dynamic_filtering/groups_kept"]) == (1.0, 8.0)
        assert row["rollout/num_samples"] == 8 * 4 and "policy/grad_norm" in row  # every kept episode trained


def test_the_cpu_recipe_in_dotted_flags_trains(tmp_path, engine, tiny_model, digit_reward, recipe_argv):
    """examples/scripts/train_reinforce_pro_cpu_dotted.sh (OpenRLHF v0.11 spelling), run by bash with a python
    that records its argv; those flags, sized down for the shared engine in the same spelling, train."""
    argv = recipe_argv("train_reinforce_pro_cpu_dotted.sh", STEPS="2")
    assert "--rollout.batch_size" in argv
    sized = ["--rollout.batch_size", "8", "--train.batch_size", "64", "--data.max_samples", "16",
             "--train.micro_batch_size", "32", "--rollout.micro_batch_size", "64", "--data.max_len", "64",
             "--rollout.max_new_tokens", "6", "--ds.param_dtype", "fp32", "--vllm_dtype", "float32",
             "--actor.num_gpus_per_node", "1", "--algo.kl.init_coef", "0", "--actor.model_name_or_path", tiny_model,
             "--reward.remote_url", digit_reward, "--sft_warmup_steps", "0"]  # fmt: skip
    args, cfg = parse(argv + sized)
    assert (args.vllm_is_correction_type, args.n_samples_per_prompt, args.save_path) == (
        "reinforce_pro", 8, str(tmp_path / "run"))  # fmt: skip
    history = build_and_fit(cfg, prepare(cfg), engines=[engine])
    assert len(history) == 2 and all(h["policy/grad_norm"] > 0 and "is/token_masked_frac" in h for h in history)


def _policy_workers(tiny_model, world_size: int, loss=None, forward=None):
    """`world_size` PolicyWorker ranks of one fresh policy (zero stage 0, fp32, lr 1e-2), one process group."""
    import tempfile
    import uuid

    from reinforce_pro.algos.losses import SurrogateConfig
    from reinforce_pro.workers.configs import DistInfo, ForwardConfig, OptimConfig
    from reinforce_pro.workers.policy import PolicyLossConfig, PolicyWorker

    start_ray(logical_cpus=8)
    opt = OptimConfig(learning_rate=1e-2, lr_scheduler="constant", zero_stage=0, param_dtype="fp32",
                      micro_batch_size=8, grad_accum_steps=2)  # fmt: skip
    loss = loss or PolicyLossConfig(
        SurrogateConfig(enable_vllm_is_correction=True, vllm_is_correction_type="reinforce_pro")
    )
    init = f"file://{tempfile.gettempdir()}/rp_test_{uuid.uuid4().hex}"
    ranks = [DistInfo(rank=r, world_size=world_size, init_method=init) for r in range(world_size)]
    return [
        ray.remote(PolicyWorker)
        .options(num_cpus=0)
        .remote(tiny_model, opt, loss, d, 0, forward or ForwardConfig("sdpa", opt.micro_batch_size))
        for d in ranks
    ]


def _random_experience(b: int = 16, p: int = 7, t: int = 9):
    """Rows with left-padded prompts and responses of different lengths, random advantages and engine log-probs."""
    from reinforce_pro.experience import Experience

    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(4, 99, (b, p + t), generator=gen)
    attn = torch.ones(b, p + t, dtype=torch.long)
    for i in range(b):
        attn[i, : i % 3] = 0  # left padding of the prompt
        attn[i, p + t - i % 4 - (i % 5) :] = 0  # right padding of the response
    action_mask = attn[:, p:].bool()
    return Experience(
        sequences=seq, attention_mask=attn, action_mask=action_mask, old_log_probs=None,
        rollout_log_probs=-torch.rand(b, t, generator=gen) * 5, advantages=torch.randn(b, t, generator=gen),
        returns=torch.zeros(b, t), rewards=torch.zeros(b),
    )  # fmt: skip


def test_training_log_probs_stand_in_for_the_old_forward(tiny_model):
    """One epoch on one mini-batch: the policy's detached training log-probs replace the separate old-log-prob
    forward (PPOTrainer.old_log_probs_needed). Two identical policies, one given the old log-probs from that
    forward and one given none, must return the same numbers and make the same update."""
    from dataclasses import replace

    from safetensors.torch import load

    from reinforce_pro.algos.stats import reduce_stats
    from reinforce_pro.experience import split_experience

    exp = _random_experience()
    seq, attn, action_mask, t = exp.sequences, exp.attention_mask, exp.action_mask, exp.num_actions
    (separate,), (reusing,) = _policy_workers(tiny_model, 1), _policy_workers(tiny_model, 1)
    old = ray.get(separate.log_probs.remote(seq, attn, t))
    tokens, seqs = float(action_mask.sum()), float(len(exp))
    stats_a, none = ray.get(
        separate.train_minibatch.remote(split_experience(replace(exp, old_log_probs=old), 2), tokens, seqs)
    )
    stats_b, reused = ray.get(reusing.train_minibatch.remote(split_experience(exp, 2), tokens, seqs))
    assert none is None
    # float32 log-probs of size ~5 from two forwards of other shapes: a few ULPs apart on some hosts
    torch.testing.assert_close(reused[action_mask], old[action_mask], atol=1e-6, rtol=1e-6)
    stats_a, stats_b = reduce_stats([stats_a]), reduce_stats([stats_b])
    for key in ("policy/pg_loss", "is/vllm_kl", "is/token_masked_frac", "policy/clip_frac"):
        assert stats_b[key] == pytest.approx(stats_a[key], abs=1e-6), key
    after_a, after_b = (load(ray.get(w.state_dict_bytes.remote())) for w in (separate, reusing))
    for name, weight in after_a.items():
        torch.testing.assert_close(after_b[name], weight, atol=1e-6, rtol=0)
    before = load((Path(tiny_model) / "model.safetensors").read_bytes())
    assert not torch.equal(before["model.norm.weight"], after_a["model.norm.weight"])  # the step moved weights
    for w in (separate, reusing):
        ray.kill(w)


def test_two_ranks_log_the_metrics_of_the_whole_batch(tiny_model):
    """The same mini-batch trained by one rank and by two ranks with shards of different sizes (and
    different token counts) logs the same metrics once every rank's are merged (algos/stats.py), and the
    logged policy/pg_loss is the PolicyLoss of the whole batch recomputed on the driver."""
    from reinforce_pro.algos.losses import PolicyLoss
    from reinforce_pro.algos.stats import reduce_stats
    from reinforce_pro.experience import split_experience

    exp = _random_experience()
    tokens, seqs = float(exp.action_mask.sum()), float(len(exp))
    single, pair = _policy_workers(tiny_model, 1), _policy_workers(tiny_model, 2)
    shards = [list(range(0, 5)), list(range(5, 16))]  # uneven on purpose: 5 and 11 rows
    one_ref = single[0].train_minibatch.remote(split_experience(exp, 2), tokens, seqs)
    two_refs = [w.train_minibatch.remote(split_experience(exp.select(torch.tensor(rows)), 2), tokens, seqs)
                for w, rows in zip(pair, shards, strict=True)]  # fmt: skip
    (one_stats, one_lp), two = ray.get(one_ref), ray.get(two_refs)
    one, merged = reduce_stats([one_stats]), reduce_stats([stats for stats, _ in two])
    rank0 = reduce_stats([two[0][0]])
    assert set(merged) == set(one)
    for key, value in one.items():
        assert merged[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert any(rank0[k] != pytest.approx(one[k], rel=1e-3) for k in ("is/vllm_kl", "policy/pg_loss", "is/ratio_max"))
    # the loss that was optimised, on the whole batch: the training log-probs are the old ones (ratio 1)
    loss, _ = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type="reinforce_pro")(
        one_lp, one_lp, exp.advantages, exp.action_mask, exp.rollout_log_probs
    )
    assert merged["policy/pg_loss"] == pytest.approx(float(loss), rel=1e-4, abs=1e-7)
    for w in single + pair:
        ray.kill(w)


def test_adaptive_kl_coefficient_is_the_one_the_kl_loss_uses(tmp_path, engine, tiny_model, digit_reward):
    """With --use_kl_loss and --kl_target, the coefficient adapts, is logged as kl/coef at the step that
    used it, and is checkpointed; the policy worker's KL term takes the coefficient handed to it each step."""
    from dataclasses import replace

    from safetensors.torch import load

    from reinforce_pro.algos.kl import AdaptiveKLController
    from reinforce_pro.algos.losses import SurrogateConfig
    from reinforce_pro.experience import split_experience
    from reinforce_pro.workers.policy import PolicyLossConfig

    _, plan, history = run(
        ["--advantage_estimator", "rloo", "--use_kl_loss", "--kl_estimator", "k3", "--init_kl_coef", "0.05",
         "--kl_target", "1e-6", "--kl_horizon", "64", "--remote_rm_url", digit_reward, "--save_steps", "3",
         "--ckpt_path", str(tmp_path / "ckpt")],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    assert len(history) == 3
    ctl = AdaptiveKLController(0.05, 1e-6, 64)  # replays the controller on the logged KL
    for row in history:
        assert row["kl/coef"] == pytest.approx(ctl.value, rel=1e-9)
        ctl.update(row["kl/ref_kl_mean"], int(row["rollout/num_samples"]))
    assert len({row["kl/coef"] for row in history}) == 3  # it moved at every step
    state = load_state(find_latest(tmp_path / "ckpt"))
    assert state["kl_coef"] == pytest.approx(ctl.value, rel=1e-9)  # the next step's coefficient

    # the worker's KL term uses the coefficient of the call: 0 trains like no KL loss, 5 does not
    exp = _random_experience()
    exp = replace(exp, ref_log_probs=exp.rollout_log_probs - 0.5)
    no_kl, kl_loss_cfg = PolicyLossConfig(SurrogateConfig()), PolicyLossConfig(SurrogateConfig(), True, "k3")
    (plain,), (zero,), (five,) = (_policy_workers(tiny_model, 1, cfg) for cfg in (no_kl, kl_loss_cfg, kl_loss_cfg))
    tokens, seqs = float(exp.action_mask.sum()), float(len(exp))
    ray.get([w.train_minibatch.remote(split_experience(exp, 2), tokens, seqs, coef)
             for w, coef in ((plain, 0.0), (zero, 0.0), (five, 5.0))])  # fmt: skip
    after = [load(ray.get(w.state_dict_bytes.remote())) for w in (plain, zero, five)]
    torch.testing.assert_close(after[1]["model.norm.weight"], after[0]["model.norm.weight"], atol=1e-6, rtol=0)
    assert not torch.allclose(after[2]["model.norm.weight"], after[0]["model.norm.weight"], atol=1e-5)
    for w in (plain, zero, five):
        ray.kill(w)


def test_adaptive_lag_moves_with_the_mismatch(tmp_path, engine, tiny_model, digit_reward):
    """--async_lag_target. A target far below the measured mismatch pulls the producer's lead to 0
    (later rows are never stale); one far above lets it grow to --async_queue_size. The trainer runs in
    micro-batches of 1 row (the same gradient, slower) so that the producer is the faster side on any host:
    how far ahead it gets otherwise depends on the host and on what else runs (is_study's -mb4 regimes)."""
    common = ["--async_train", "--async_queue_size", "3", "--async_lag_metric", "rollout/logprob_abs_diff_mean",
              "--remote_rm_url", digit_reward, "--max_samples", "40", "--micro_train_batch_size", "1"]  # fmt: skip
    _, _, tight = run([*common, "--async_lag_target", "1e-12"], tmp_path / "tight", engine, tiny_model)
    _, _, loose = run([*common, "--async_lag_target", "10"], tmp_path / "loose", engine, tiny_model)
    assert [h["async/max_lag"] for h in tight] == [0.0] * 5
    assert [h["async/max_lag"] for h in loose] == [2.0, 3.0, 3.0, 3.0, 3.0]
    assert tight[-1]["async/staleness_max"] == 0.0  # produced after the lead dropped to 0
    assert max(h["async/staleness_max"] for h in loose) >= 2.0


def test_reseeding_an_engine_repeats_its_samples(engine):
    """studies/is_study.py pairs runs on one engine: after reseed(s) the same weights sample the same tokens."""
    prompts, sampling = [[1, 21, 15, 22, 33]] * 8, {"max_tokens": 6, "temperature": 1.0}
    ray.get(engine.reseed.remote(5))
    first = ray.get(engine.generate.remote(prompts, sampling))
    ray.get(engine.reseed.remote(5))
    again = ray.get(engine.generate.remote(prompts, sampling))
    ray.get(engine.reseed.remote(6))
    other = ray.get(engine.generate.remote(prompts, sampling))
    assert [g.token_ids for g in again] == [g.token_ids for g in first]
    assert [g.token_ids for g in other] != [g.token_ids for g in first]


def test_the_engine_samples_the_same_tokens_without_making_text(engine, tiny_model):
    """generate() returns ids and log-probs only, so it skips detokenizing unless stop strings need the text:
    the same seed samples the same tokens with the same log-probs either way, and a stop string still stops."""
    from transformers import AutoTokenizer

    prompts, sampling = [[1, 21, 15, 22, 33]] * 8, {"max_tokens": 6, "temperature": 1.0}
    ray.get(engine.reseed.remote(5))
    ids_only = ray.get(engine.generate.remote(prompts, sampling))
    ray.get(engine.reseed.remote(5))
    with_text = ray.get(engine.generate.remote(prompts, {**sampling, "detokenize": True}))
    assert [g.token_ids for g in ids_only] == [g.token_ids for g in with_text]
    assert [g.log_probs for g in ids_only] == [g.log_probs for g in with_text]
    tok = AutoTokenizer.from_pretrained(tiny_model)
    row = next(
        i
        for i, g in enumerate(with_text)
        if len(g.token_ids) > 2 and not set(g.token_ids[:2]) & set(tok.all_special_ids)
    )
    stop = tok.decode(with_text[row].token_ids[:2])  # the row's first two tokens, sampled alike after reseeding
    ray.get(engine.reseed.remote(5))
    stopped = ray.get(engine.generate.remote(prompts, {**sampling, "stop": [stop]}))[row]
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) <= 2


def test_the_engine_returns_each_positions_likeliest_tokens_when_asked_and_samples_the_same(engine):
    """An endpoint request's top_logprobs k: each position's k likeliest tokens (id, log-prob), most likely first,
    from the distribution the token was sampled from (a sampled token among them has its own log-prob there);
    the same seed samples the same tokens with and without them."""
    import math

    prompts, sampling = [[1, 21, 15, 22, 33]] * 4, {"max_tokens": 6, "temperature": 1.0}
    ray.get(engine.reseed.remote(9))
    plain = ray.get(engine.generate.remote(prompts, sampling))
    ray.get(engine.reseed.remote(9))
    topped = ray.get(engine.generate.remote(prompts, {**sampling, "top_logprobs": 3}))
    assert [g.token_ids for g in plain] == [g.token_ids for g in topped] and plain[0].top_log_probs is None
    for g in topped:
        assert len(g.top_log_probs) == len(g.token_ids)
        for token, lp, top in zip(g.token_ids, g.log_probs, g.top_log_probs, strict=True):
            assert len(top) == 3 and [v for _, v in top] == sorted((v for _, v in top), reverse=True)
            assert lp <= top[0][1] + 1e-6 and sum(math.exp(v) for _, v in top) <= 1 + 1e-5  # one distribution
            if token in dict(top):
                assert math.isclose(dict(top)[token], lp, abs_tol=1e-6)


def test_a_frozen_engine_scores_given_tokens_as_an_fp32_forward_does(engine, tiny_model):
    """VLLMEngine.score, prefill only (the building block of a teacher for on-policy distillation): the log-probs
    of tokens another policy sampled, each response's tokens after its prompt, equal an HF fp32 forward of the
    same ids within fp32 noise, and are the engine's own sampled log-probs for tokens it sampled itself."""
    from safetensors.torch import load_file, save

    ray.get(engine.update_weights.remote(save(load_file(Path(tiny_model) / "model.safetensors"))))
    prompt = [1, 21, 15, 27, 33]
    sampled = ray.get(engine.generate.remote([prompt] * 4, {"temperature": 1.0, "max_tokens": 6}))
    others = [[21, 15, 22], [33, 33, 33, 2]]  # tokens this policy did not sample: any ids are scored
    responses = [g.token_ids for g in sampled] + others
    scored = ray.get(engine.score.remote([prompt + r for r in responses], [len(prompt)] * len(responses)))
    for response, lp in zip(responses, scored, strict=True):
        reference = trainer_log_probs(tiny_model, prompt, response)
        assert len(lp) == len(response) and (reference - torch.tensor(lp)).abs().max().item() < 1e-4
    for g, lp in zip(sampled, scored, strict=False):
        assert (torch.tensor(g.log_probs) - torch.tensor(lp)).abs().max().item() < 1e-4


def test_min_new_tokens_keeps_every_response_open_until_its_length(engine, tiny_model):
    """--min_new_tokens (vLLM's min_tokens) is what makes bench_peers' work equal on both sides: with <eos> made
    near certain, every response ends at once without it and runs to the minimum with it."""
    from transformers import AutoTokenizer

    from reinforce_pro.rollout.sampler import RolloutConfig, sampling_params

    eos = AutoTokenizer.from_pretrained(tiny_model).eos_token_id
    prompts, bias = [[1, 21, 15, 22, 33]] * 8, {"logit_bias": {eos: 100.0}}
    free = sampling_params(RolloutConfig(max_new_tokens=6))
    held = sampling_params(RolloutConfig(max_new_tokens=6, min_new_tokens=6))
    assert "min_tokens" not in free and held["min_tokens"] == 6
    ended = ray.get(engine.generate.remote(prompts, {**free, **bias}))
    kept = ray.get(engine.generate.remote(prompts, {**held, **bias}))
    assert [len(g.token_ids) for g in ended] == [1] * 8
    assert [len(g.token_ids) for g in kept] == [6] * 8 and {g.finish_reason for g in kept} == {"length"}


@pytest.mark.parametrize(
    "setting",
    [pytest.param({"top_p": 0.8}, id="top-p"), pytest.param({"top_k": 5}, id="top-k"),
     pytest.param({"min_new_tokens": 4}, id="min-tokens"),
     pytest.param({"top_p": 0.9, "top_k": 8, "temperature": 0.7}, id="all")],
)  # fmt: skip
def test_the_trainer_replays_the_engines_sampling_filter(engine, tiny_model, setting):
    """On equal fp32 weights the engine's log-probs (vLLM's processed ones: its support renormalised) and the
    trainer's agree to 1e-5 under every filter the CLI accepts, where the full softmax misses them by the log of
    the kept mass."""
    from safetensors.torch import load_file, save
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.logprobs import token_log_probs
    from reinforce_pro.models.sampling_filter import SamplingFilter, with_engine_stop_ids
    from reinforce_pro.rollout.sampler import RolloutConfig, sampling_params

    cfg = RolloutConfig(max_new_tokens=6, **setting)
    filt = with_engine_stop_ids(SamplingFilter(cfg.top_k, cfg.top_p, min_tokens=cfg.min_new_tokens), tiny_model)
    # the shared engine holds whatever an earlier test's run synced into it: give it the weights scored here
    ray.get(engine.update_weights.remote(save(load_file(Path(tiny_model) / "model.safetensors"))))
    ray.get(engine.reseed.remote(3))
    prompt = [1, 21, 15, 27, 33]
    generations = ray.get(engine.generate.remote([prompt] * 16, sampling_params(cfg)))
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    replayed, full = [], []
    for g in generations:
        seq = torch.tensor([prompt + g.token_ids])
        with torch.no_grad():
            logits = forward_logits(model, seq, torch.ones_like(seq), predicting=len(g.token_ids))
        targets = seq[:, -len(g.token_ids) :]
        engine_lp = torch.tensor([g.log_probs])
        replayed.append((token_log_probs(logits, targets, cfg.temperature, sampling_filter=filt)[0] - engine_lp).abs())
        full.append((token_log_probs(logits, targets, cfg.temperature)[0] - engine_lp).abs())
    if "min_new_tokens" in setting:
        assert min(len(g.token_ids) for g in generations) >= 4
    assert torch.cat(replayed, dim=1).max().item() < 1e-5
    assert torch.cat(full, dim=1).mean().item() > 1e-3  # the setting did filter: without the replay they differ


def test_a_response_cut_by_a_stop_string_trains_the_ids_the_engine_returned(engine, tiny_model):
    """A stop string (self-play roles, agents' requests): the engine cuts the text, and its ids and log-probs stay
    one per token, all finite, ending with the token that completed the stop string; those ids are what a row
    trains, each weighted like any token. The trainer's log-probs of them agree with the engine's (fp32)."""
    from safetensors.torch import load_file, save
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reinforce_pro.models.logprobs import token_log_probs

    ray.get(engine.update_weights.remote(save(load_file(Path(tiny_model) / "model.safetensors"))))
    ray.get(engine.reseed.remote(5))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompt = [1, 21, 15, 27, 33]
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 12, "stop": ["e", "a", "o", " "]}
    generations = ray.get(engine.generate.remote([prompt] * 16, sampling))
    cut = [g for g in generations if g.finish_reason == "stop" and tokenizer.decode(g.token_ids)[-1:] in "eao "]
    assert cut  # some responses ended on a stop string
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    for g in generations:
        assert len(g.log_probs) == len(g.token_ids) and all(math.isfinite(x) for x in g.log_probs)
        seq = torch.tensor([prompt + g.token_ids])
        with torch.no_grad():
            logits = forward_logits(model, seq, torch.ones_like(seq), predicting=len(g.token_ids))
        lp, _ = token_log_probs(logits, seq[:, -len(g.token_ids) :])
        assert (lp[0] - torch.tensor(g.log_probs)).abs().max().item() < 1e-5


def test_a_run_under_sampling_filters_sees_no_mismatch_at_equal_weights(tmp_path, engine, tiny_model, digit_reward):
    """The whole path (flags -> the policy's and the reference's replay -> the metrics): with top-p, top-k and
    a minimum length at once, the fp32 engine and trainer agree before every step's update, and the IS weights
    of reinforce_pro are 1 to within float noise (the kept mass no longer shows as drift)."""
    cfg, plan, history = run(
        ["--advantage_estimator", "reinforce_baseline", "--enable_vllm_is_correction",
         "--vllm_is_correction_type", "reinforce_pro", "--remote_rm_url", digit_reward, "--init_kl_coef", "0.01",
         "--top_p", "0.8", "--top_k", "5", "--min_new_tokens", "3", "--max_samples", "16"],
        tmp_path, engine, tiny_model,
    )  # fmt: skip
    rows = read_metrics(plan.run_dir / "metrics.jsonl")
    assert len(rows) == 2 and cfg.loss.sampling_filter.top_p == 0.8
    assert all(r["rollout/logprob_abs_diff_max"] < 1e-5 for r in rows), rows
    assert all(r["rollout/outside_filter_frac"] == 0 for r in rows)  # both sides keep the same support
    assert abs(rows[0]["kl/ref_kl_mean"]) < 1e-6  # policy and reference start equal, under the same filter
    assert all(r["is/token_masked_frac"] == 0 and r["is/ratio_min"] > 1 - 1e-5 for r in rows)
