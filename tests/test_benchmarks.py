"""The benchmark scripts run end to end at a tiny size and write what they promise (no timing asserted)."""

import json
import re

import pytest

from benchmarks import bench_is_correction


def test_bench_is_correction_writes_json_table_and_plot(tmp_path):
    rc = bench_is_correction.main(
        ["--sizes", "2x16,3x8", "--repeats", "2", "--warmup", "0", "--output", str(tmp_path), "--system-malloc"]
    )
    assert rc == 0
    payload = json.loads((tmp_path / "bench_is_correction.json").read_text())
    assert {"benchmark", "commit", "machine", "config", "results"} <= set(payload)
    assert payload["machine"]["torch"].startswith("2.")
    rows = payload["results"]
    assert {(r["B"], r["T"]) for r in rows} == {(2, 16), (3, 8)}
    assert {r["variant"] for r in rows} == set(bench_is_correction.VARIANTS)
    assert all(r["variant"] != "tis" or r["ratio_to_tis"] == 1.0 for r in rows)
    table = (tmp_path / "bench_is_correction.md").read_text()
    assert "| reinforce_pro |" in table and "B=3, T=8" in table
    assert (tmp_path / "bench_is_correction.png").stat().st_size > 1000


@pytest.mark.parametrize("name", ["W1", "W3"])
def test_bench_peers_our_command_parses_and_means_the_same_work(tmp_path, name):
    from benchmarks import bench_peers
    from reinforce_pro.cli.train_ppo_ray import parse_args

    w = bench_peers.WORKLOADS[name]
    per_step = w.prompts_per_step * w.n_samples_per_prompt
    spec = {**bench_peers.asdict(w), "model": str(tmp_path / "m"), "prompts": str(tmp_path / "p.jsonl"),
            "samples_per_step": per_step, "warmup_steps": 2}  # fmt: skip
    cmd = bench_peers.ours_command(spec, tmp_path / "run")
    assert cmd[1:3] == ["-m", "reinforce_pro.cli.train_ppo_ray"]
    args = parse_args(cmd[3:])
    assert (args.rollout_batch_size, args.n_samples_per_prompt, args.train_batch_size) == (
        w.prompts_per_step, 8, per_step
    )  # fmt: skip
    assert (args.max_new_tokens, args.micro_train_batch_size, args.zero_stage) == (w.max_new_tokens, 16, 0)
    assert args.min_new_tokens == w.max_new_tokens  # equal-length work: every response max_new_tokens long
    assert (args.init_kl_coef, args.param_dtype, args.vllm_dtype, args.advantage_estimator) == (
        0.0, "fp32", "float32", "group_norm"
    )  # fmt: skip
    steps = args.num_episodes * (args.max_samples // args.rollout_batch_size)
    assert steps >= 2 + w.steps  # enough steps for warm-up plus the measured ones
    assert steps < 2 + w.steps + args.max_samples // args.rollout_batch_size  # and not an episode more


def test_bench_peers_counts_the_matmul_work_of_a_step(tmp_path):
    from benchmarks import bench_peers
    from reinforce_pro.models.tiny import build_tiny_model

    arch = bench_peers.TinyArch(64, 2, 128, 4, 2)
    model = build_tiny_model(tmp_path / "m", **bench_peers.asdict(arch))
    work = bench_peers.train_work(model, [{"question": "What is 1 + 2?"}, {"question": "What is 10 + 20?"}])
    cfg = json.loads((model / "config.json").read_text())
    # per layer: q, o (64 x 64), k, v (64 x 32: 2 of 4 heads), gate, up, down (64 x 128); plus the LM head
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128
    assert work["matmul_params"] == 2 * layer + cfg["vocab_size"] * 64
    assert work["prompt_tokens_mean"] > len("What is 10 + 20?")  # a character tokenizer, plus the chat template
    assert bench_peers.gemm_peak_gflops(size=64, repeats=2) > 0


def test_bench_peers_summary_and_render(tmp_path):
    from benchmarks import bench_peers

    ours = {"steps": [{"seconds": 9.0, "tokens": 10, "samples": 4, "generate": 1, "make_experience": 0, "train": 8,
                       "weight_sync": 0}] + [{"seconds": s, "tokens": 100, "samples": 4, "generate": 0.5,
                                              "make_experience": 0.0, "train": 0.4, "weight_sync": 0.1}
                                             for s in (1.0, 1.0, 2.0)],
            "process_wall_s": 30.0, "first_step_s": 12.0,
            "first_run": {"steps": [{"seconds": 2.0}], "first_step_s": 50.0}}  # fmt: skip
    versions = {"trl": "1.16.0", "transformers": "5.19.0", "torch": "2.13.0"}
    trl = {"steps": [{"seconds": 5.0, "tokens": 1}] + [{"seconds": 2.0, "tokens": 100}] * 3,
           "process_wall_s": 20.0, "first_step_s": 7.5, "versions": versions}  # fmt: skip
    spec = {"warmup_steps": 1, "matmul_params": 1000, "prompt_tokens_mean": 25.0}
    s_ours, s_trl = bench_peers.summarise(ours, spec, 2.0), bench_peers.summarise(trl, spec, 2.0)
    assert s_ours["tokens_per_s"] == 300 / 4.0 and s_ours["median_step_s"] == 1.0
    assert s_ours["median_phase_s"]["train"] == 0.4
    assert s_ours["train_roofline_s"] == 6 * 1000 * (4 * 25 + 100) / 2e9  # 6 x params x tokens / peak
    assert s_trl["tokens_per_s"] == 300 / 6.0 and "median_phase_s" not in s_trl and s_trl["first_step_s"] == 7.5
    workload = {"prompts_per_step": 2, "n_samples_per_prompt": 4, "equal_lengths": True}  # 8 responses a step
    results = {"W1": {"trl": s_trl, "ours": s_ours, "throughput_ratio": 1.5, "gemm_peak_gflops": 2.0,
                      "workload": workload, "raw": {"trl": trl, "ours": ours}}}  # fmt: skip
    payload = {"results": results, "machine": {"cpu": "cpu", "cpu_count": 2, "torch": "2.13.0+cpu"}, "commit": "abc",
               "config": {"warmup_steps": 1}}  # fmt: skip
    table = bench_peers.render(payload, tmp_path)
    assert s_ours["startup_s"] == 12.0 - 9.0 and s_trl["startup_s"] == 7.5 - 5.0  # first step's end less its time
    assert s_ours["startup_first_run_s"] == 48.0 and "startup_first_run_s" not in s_trl
    # mean length: 100 tokens / 8 responses; step time TRL's over ours (2.0 / 1.0) beside tokens / s
    assert "| W1 | train_ppo_ray | 12.5 | 1.00 | 75 | 48 / 3 | 30 | 2.00x | **1.50x** |" in table
    assert "| W1 | TRL GRPOTrainer | 12.5 | 2.00 | 50 | 2 | 20 |  |  |" in table
    assert "responses all max_new_tokens long on both sides" in table
    assert f"| 0.400 | 0.100 | {0.0006:.3f} | {0.4 / 0.0006:.2f}x |" in table  # train, weight_sync, roofline
    assert (tmp_path / "bench_peers.png").stat().st_size > 1000


def test_bench_async_conditions_parse_and_summaries_render(tmp_path):
    from benchmarks import bench_async
    from reinforce_pro.cli.train_ppo_ray import parse_args

    for name, flags in bench_async.CONDITIONS.items():
        args = parse_args(["--save_path", str(tmp_path / name), *flags])
        assert args.async_train == (name != "sync") and args.preset == "embedded"
    assert parse_args(bench_async.CONDITIONS["async_q2"]).async_queue_size == 2

    def history(step_s: float, rewards: list[float], stale: float) -> list[dict]:
        phases = {"time/generate": step_s, "time/make_experience": 0.0, "time/train": 0.1, "time/weight_sync": 0.0}
        rollout = {"rollout/num_samples": 256.0, "async/staleness_mean": stale, "rollout/logprob_abs_diff_mean": 0.01}
        return [{"time/step": step_s, "rollout/reward_mean": r, **rollout, **phases} for r in rewards]

    runs = {
        "sync": {"1": bench_async.summarise(history(0.5, [0.1, 0.2, 0.3, 0.5], 0.0), warmup=1, final_window=2)},
        "async_q1": {"1": bench_async.summarise(history(0.25, [0.1, 0.2, 0.4, 0.4], 1.0), warmup=1, final_window=2)},
    }
    sync, q1 = runs["sync"]["1"], runs["async_q1"]["1"]
    assert sync["samples_per_s"] == 512 and q1["samples_per_s"] == 1024
    assert sync["final_reward"] == 0.4 and sync["train_wall_s"] == 2.0 and q1["curve"][-1] == [1.0, 0.4]
    summary = bench_async.summary_table(runs)
    assert summary["async_q1"]["speedup_vs_sync"] == 2.0 and summary["async_q1"]["staleness_mean"] == 1.0
    payload = {"results": {"runs": runs, "summary": summary}, "commit": "abc",
               "machine": {"cpu": "cpu", "cpu_count": 2, "torch": "2.13.0+cpu"},
               "config": {"steps": 4, "seeds": [1], "warmup_steps": 1, "final_window": 2}}  # fmt: skip
    table = bench_async.render(payload, tmp_path)
    assert "| async_q1 | 1024 | 2.00x | 0.400 (0.400-0.400) | 1 | 1.00 |" in table
    assert (tmp_path / "bench_async.png").stat().st_size > 1000


def test_bench_sandbox_times_both_sandboxes_and_renders(tmp_path):
    from benchmarks import bench_sandbox

    assert bench_sandbox.main(["--calls", "2", "--baseline", "HEAD", "--output", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "bench_sandbox.json").read_text())
    for name in ("baseline", "current"):
        assert payload["results"][name]["run_once_ms"]["calls"] == 2 and payload["results"][name]["failures"] == 0
    assert "seccomp" in payload["results"]["current"]["layers"]
    assert "Isolation cost" in (tmp_path / "bench_sandbox.md").read_text()


def test_bench_smollm2_flags_parse_and_the_table_renders(tmp_path):
    from reinforce_pro.cli.train_ppo_ray import parse_args
    from studies import bench_smollm2

    args = parse_args(bench_smollm2.run_flags(tmp_path / "model", tmp_path / "data"))
    assert args.label_key == "entry" and args.apply_chat_template and args.vllm_dtype == "bfloat16"
    assert args.n_samples_per_prompt * args.rollout_batch_size == args.train_batch_size == 16
    assert bench_smollm2.phase_time({"time/step": 9.0, "time/eval": 4.0}, "step") == 5.0
    assert bench_smollm2.phase_time({"time/train": 3.0, "time/eval": 4.0}, "train") == 3.0
    phases = {p: 1.0 for p in bench_smollm2.PHASES}
    run = {"steps": 20, "train_wall_s": 600.0, "eval": [[0, 0.3], [20, 0.5]], "phase_median_s": phases,
           "response_tokens_per_s": 5.0, "reward_curve": [[1, 0.2, 0.9], [2, 0.3, 1.0]]}  # fmt: skip
    mismatch = {"tokens": 400, "abs_dlogp_mean": 0.03, "abs_dlogp_max": 0.2, "tis/token_masked_frac": 0.0}
    results = {"full": run, "lora": run, "mismatch_before": mismatch, "mismatch_after": mismatch}
    payload = {"commit": "abc", "machine": {"cpu": "cpu", "cpu_count": 2},
               "config": {"task": "chain_sum", "task_settings": {}}, "results": results}  # fmt: skip
    table = bench_smollm2.render(payload, tmp_path)
    assert "| full fine-tune | 0.300 | 0.500 | 20 | 600 |" in table
    assert "| before training | 400 | 0.0300 | 0.200 | 0.0000 |" in table
    assert (tmp_path / "bench_smollm2.png").stat().st_size > 1000


def test_bench_weight_sync_renders_measured_and_computed_rows(tmp_path):
    from benchmarks import bench_weight_sync

    results = [
        {"size": "toy", "parameters": 4e5, "bytes": 1.6e6, "tensors": 27, "object_store_s": 0.05, "gloo_s": 0.04},
        {"size": "100m", "parameters": 1e8, "bytes": 4e8, "tensors": 171, "object_store_s": 1.6, "gloo_s": 0.8},
    ]
    payload = {"commit": "abc", "machine": {"cpu": "cpu", "cpu_count": 2}, "config": {"reps": 5, "bucket_mb": 256},
               "results": results}  # fmt: skip
    table = bench_weight_sync.render(payload, tmp_path)
    assert "| 100m | 100.0M | 381.5 | 171 | 1.600 | 0.800 | 2.00x |" in table
    # 7B in bf16 is 15.24 GB: 0.30 s at 50 GB/s; the object store at the 100m model's 0.25 GB/s takes 61 s
    assert "| 7B | 15.2 | 0.03 | 0.30 | 1.22 | 60.96 |" in table
    assert (tmp_path / "bench_weight_sync.png").stat().st_size > 1000


@pytest.mark.e2e
def test_bench_train_phase_profiles_a_real_policy_step(tmp_path):
    """The policy worker of a run, at a tiny size, in its own process (DeepSpeed starts torch.distributed)."""
    import subprocess
    import sys
    from pathlib import Path

    from benchmarks import bench_train_phase
    from reinforce_pro.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2, intermediate_size=128)
    root = Path(bench_train_phase.__file__).parent.parent
    args = ["--model", str(model), "--rows", "4", "--micro", "2", "--steps", "1", "--max_response_tokens", "8",
            "--prompt_tokens", "10", "--output", str(tmp_path)]  # fmt: skip
    subprocess.run([sys.executable, "-m", "benchmarks.bench_train_phase", *args], check=True, timeout=600, cwd=root)
    payload = json.loads((tmp_path / "bench_train_phase.json").read_text())
    r = payload["results"]
    assert len(r["step_s"]) == 1 and r["roofline_s"] > 0 and r["trained_tokens"] <= 4 * 18
    profile = r["profile"]
    assert set(profile["by_kind_s"]) == set(bench_train_phase.KINDS)
    assert profile["by_kind_s"]["GEMM"] > 0 and profile["gemm_flops"] > 0
    assert sum(profile["by_kind_s"].values()) <= profile["wall_s"] * 1.05  # self times partition the step
    assert profile["by_kind_s"]["optimizer step"] > 0  # AdamW's ops are found under its step
    assert set(r["median_step_s_without"]) >= {"(added) --packing_samples", COMPILED}  # each variant timed
    table = (tmp_path / "bench_train_phase.md").read_text()
    assert "| GEMM |" in table and "GFLOP/s" in table and "| no op (Python" in table


COMPILED = "(added) --packing_samples, norms / MLP / rotary compiled"


def test_compiled_elementwise_compiles_the_pieces_and_gives_them_back(tmp_path):
    """bench_train_phase's compiled variant: every RMSNorm and MLP compiled and the rotary function swapped for
    the block only, the same log-probs as eager (Inductor's fused loops reorder float sums: close, not equal)."""
    import sys
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.bench_train_phase import compiled_elementwise
    from reinforce_pro.models.tiny import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(
        build_tiny_model(tmp_path / "m", hidden_size=64, intermediate_size=128)
    )
    modeling = sys.modules[type(model).__module__]
    rotary = modeling.apply_rotary_pos_emb
    ids = torch.randint(10, 90, (2, 12))
    eager = model(input_ids=ids).logits
    worker = SimpleNamespace(engine=SimpleNamespace(module=model))
    with compiled_elementwise(worker):
        assert modeling.apply_rotary_pos_emb is not rotary
        pieces = [m for m in model.modules() if type(m).__name__.endswith(("RMSNorm", "MLP"))]
        assert len(pieces) == 2 * 3 + 1  # two norms and an MLP in each of the 2 layers, the final norm
        assert all(m._compiled_call_impl is not None for m in pieces)
        compiled = model(input_ids=ids).logits
    assert modeling.apply_rotary_pos_emb is rotary
    assert all(m._compiled_call_impl is None for m in model.modules())
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)


def test_bench_generate_ceiling_renders_its_table(tmp_path):
    from benchmarks.bench_generate_ceiling import render

    run = {"batch_s": [7.0, 6.0, 6.5, 6.4], "response_tokens": [1600, 1500, 1700, 1640], "median_batch_s": 6.45,
           "tokens_per_s": 260.0}  # fmt: skip
    payload = {"benchmark": "bench_generate_ceiling", "commit": "0" * 40, "config": {"batches": 4, "warmup": 1},
               "machine": {"cpu": "test cpu", "cpu_count": 2},
               "results": {"runs": {"plain": run, "prefix caching": run}, "gemm_peak_gflops": 180.0,
                           "matmul_params": 134_500_000, "prompt_tokens_mean": 1272, "response_tokens_mean": 1613,
                           "compute_bound_s": 4.31}}  # fmt: skip
    table = render(payload, tmp_path)
    assert "| plain | 6.45 | 260 | 7.00, 6.00, 6.50, 6.40 |" in table and "| prefix caching |" in table
    assert "= 4.31 s a batch" in table and (tmp_path / "bench_generate_ceiling.md").read_text() == table


def test_bench_study_generate_renders_each_engine_and_output_against_the_first(tmp_path):
    from benchmarks.bench_study_generate import BASELINE, ENGINES, MODES, render

    runs = {name: {mode: {"batch_s": [2.0, 1.5, 1.6], "median_s": 1.5 - 0.1 * i - 0.5 * j, "engine_steps": 73 - i,
                          "ms_per_engine_step": 20.0} for j, mode in enumerate(MODES)}
            for i, name in enumerate(ENGINES)}  # fmt: skip
    payload = {"benchmark": "bench_study_generate", "commit": "0" * 40,
               "config": {"batches": 3, "warmup": 1, "tokens": 62}, "machine": {"cpu": "test cpu", "cpu_count": 2},
               "results": {"runs": runs, "floor": {"batch_s": [0.4, 0.3, 0.3], "median_s": 0.3},
                           "prompt_tokens": 22, "rows": 256}}  # fmt: skip
    table = render(payload, tmp_path)
    assert f"| {BASELINE[0]} | {BASELINE[1]} | 1.50 | +0% | 73 | 20.0 | 2.00, 1.50, 1.60 |" in table
    assert f"| {BASELINE[0]} | ids only | 1.00 | -33% | 73 |" in table
    assert "| ids | 0.30 | -80% | - | 4.8 per token |" in table
    assert (tmp_path / "bench_study_generate.md").read_text() == table


def test_bench_partial_chunks_renders_each_variant_against_a_call_per_chunk(tmp_path):
    from benchmarks.bench_partial_chunks import BASELINE, VARIANTS, render

    runs = {name: {"batch_s": [3.0, 2.0, 2.1], "median_s": seconds, "calls": calls}
            for name, seconds, calls in zip(VARIANTS, [1.0, 2.0, 1.5], [1, 4, 2], strict=True)}  # fmt: skip
    payload = {"benchmark": "bench_partial_chunks", "commit": "0" * 40,
               "config": {"batches": 3, "warmup": 1, "tokens": 64, "chunk": 16},
               "machine": {"cpu": "test cpu", "cpu_count": 2},
               "results": {"runs": runs, "weight_load_s": 0.031, "prompt_tokens": 22, "rows": 256}}  # fmt: skip
    table = render(payload, tmp_path)
    assert f"| {BASELINE} | 4 | 2.00 | +0% | 3.00, 2.00, 2.10 |" in table
    assert "| whole response, one call (stale4) | 1 | 1.00 | -50% |" in table
    assert "| first chunk, then the rest in one call (now) | 2 | 1.50 | -25% |" in table
    assert "31 ms median" in table and (tmp_path / "bench_partial_chunks.md").read_text() == table


def test_bench_train_phase_sorts_ops_by_kind():
    from benchmarks.bench_train_phase import op_kind

    assert op_kind("aten::addmm") == op_kind("aten::mm") == "GEMM"
    assert op_kind("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert op_kind("aten::logsumexp") == "log-prob / loss"
    assert op_kind("aten::copy_") == op_kind("aten::view") == "copy / fill / views"
    assert op_kind("aten::scatter_add_") == "log-prob / loss" and op_kind("aten::histc") == "element-wise"
    assert op_kind("aten::mul") == "element-wise"
    assert op_kind("autograd::engine::evaluate_function: MmBackward0") == "other ops"


def test_the_search_study_resumes_the_seeds_of_the_same_settings(tmp_path):
    """studies/search_agent.py keeps the seeds an earlier invocation finished (a study outlives a session),
    but only when the settings match: runs of other settings are never mixed into one table."""
    from benchmarks.common import write_result
    from studies import search_agent
    from studies.study_stats import stored_runs

    config = {**search_agent.SETTINGS, "steps": 60}
    assert stored_runs(tmp_path / "search_agent.json", config) == []
    path = write_result("search_agent", config, {"runs": [{"seed": 1}, {"seed": 2}]}, tmp_path)
    assert [r["seed"] for r in stored_runs(path, config)] == [1, 2]
    assert stored_runs(path, {**config, "steps": 30}) == []
    assert stored_runs(path, {**config, "lr": 1e-4}) == []
    # the SDK shape's runs: a file and a config key of their own, so neither shape resumes the other's seeds
    assert stored_runs(path, {**config, **search_agent.shape_key("openai")}) == []
    assert stored_runs(path, {**config, **search_agent.shape_key("instance")}) != []
    assert (search_agent.study_name(60, "openai"), search_agent.study_name(60, "instance")) == (
        "search_agent_openai", "search_agent")  # fmt: skip
    assert search_agent.TRAINING_AGENTS["openai"].is_file() and search_agent.study_name(0, "instance").endswith("start")


def test_the_search_study_table_gives_both_paired_differences():
    from studies import search_agent

    def run(seed, before, after):
        side = lambda acc: {"accuracy": acc, "searches": 1.5, "hit": 0.5, "invalid": 0.0}  # noqa: E731
        return {"seed": seed, "before": {"search": side(before), "no_search": side(0.0)},
                "after": {"search": side(after), "no_search": side(0.0)}, "steps": 37, "rl_wall_s": 150.0}  # fmt: skip

    table = search_agent.render({"results": {"runs": [run(1, 0.1, 0.3), run(2, 0.2, 0.3)]}})
    assert "| mean | 0.150 -> 0.300 | 0.000 -> 0.000 |" in table
    assert "after RL - warm start: +0.150 [+0.100, +0.200]" in table
    assert "with search - without: +0.300 [+0.300, +0.300]" in table


def test_gpu_check_runs_its_small_shapes_on_the_cpu(tmp_path):
    """The script a GPU lease runs (benchmarks/gpu_check.py), checked here at small shapes: every part runs,
    float32 agrees with the float64 reference, the prefix filters mask some tokens, the tables render."""
    from benchmarks import gpu_check

    args = ["--device", "cpu", "--small", "--steps", "1", "--rows", "8", "--micros", "4,8", "--output", str(tmp_path)]
    assert gpu_check.main(args) == 0
    payload = json.loads((tmp_path / "gpu_check.json").read_text())
    core = {r["what"]: r for r in payload["results"]["core"]}
    from reinforce_pro.algos import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS
    from reinforce_pro.algos.is_correction import IS_CORRECTIONS

    # the loss without IS, every correction, a few again under the rollout anchor, every estimator of both tables
    computations = 1 + len(IS_CORRECTIONS) + len(gpu_check.ANCHORED) + len(ADVANTAGE_ESTIMATORS) + len(KL_ESTIMATORS)
    assert len(core) == computations
    assert all(r["device_flips"] == 0 for r in core.values())
    # kpop's is/binary_kl_mean loses digits in float32 where p ~ mu (a cancellation), its loss does not
    assert all(r["device_rel_err"] < (2e-3 if "kpop" in what else 1e-4) for what, r in core.items())
    assert core["policy loss, IS reinforce_pro"]["masked_frac"] > 0.05  # the check exercises the mask
    tokens = payload["results"]["token_log_probs"]
    assert tokens["value_abs_err"] < 1e-4 and tokens["grad_abs_diff"] < 1e-5
    model = payload["results"]["model"]
    assert model["packed_vs_padded_max_abs"] < 1e-4
    assert {(r["micro"], r["dtype"], r["packed"]) for r in model["steps"]} == {
        (m, d, p) for m in (4, 8) for d in ("fp32", "bf16 autocast") for p in (False, True)
    }
    filters = {r["setting"]: r for r in payload["results"]["sampling_filters"]}
    assert list(filters) == list(gpu_check.FILTERS)
    for r in filters.values():  # the device (here the CPU again) keeps the reference's support; float32's error
        assert r["device_support_diff"] == 0 and 0 < r["device_abs_err_max"] < 1e-5 and r["device_grad_err_max"] < 1e-5
        assert r["full_softmax_gap_mean"] > (0 if r["setting"] == "min_new_tokens 3" else 0.1)  # another distribution
    assert filters["top_k 5"]["kept_tokens_mean"] == 5.0
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| policy loss, IS reinforce_pro |" in table and "| 8 | 4 | fp32 | padded |" in table
    assert "## 4. Log-probs under the engine's sampling filters: 64 tokens x 512 vocabulary" in table
    moe = payload["results"]["moe"]  # the device is the CPU again: the same routes, the same logits
    assert moe["fp32"]["flip_frac_vs_cpu"] == 0 and moe["fp32"]["logit_err_replayed"] < 1e-5
    assert 0 < moe["bf16"]["flip_frac_vs_fp32"] < 0.2 and moe["bf16"]["logprob_gap_own"] > 0
    assert "## 5. MoE routing replay (2 layers, 8 experts, top-2" in table


def test_the_search_selfplay_table_pairs_four_arms_with_holm_and_matches_episodes():
    """studies/search_selfplay.py: every arm per seed, the episodes each trained, the warm start's stop, and
    four paired comparisons whose Holm-adjusted p-values are never below their own; (d) runs as many RL steps
    as (a)'s trained episodes fill."""
    from studies import search_selfplay as study

    def arm(accuracy: float, episodes: int) -> dict:
        return {"heldout": {"accuracy": accuracy, "hops1": accuracy + 0.1, "hops2": accuracy - 0.1},
                "solver_episodes": episodes, "curves": {"selfplay/search/valid_ratio": [0.8, 0.9],
                                                        "unified_filter/learnable_ratio": [0.4, 0.5]}}  # fmt: skip

    runs = [{"seed": seed, "host_id": "h0", "commit": "abcdef0123", "clean": True,
             "warm_start": {"sft/steps": 650, "sft/stop_accuracy": 0.29},
             "warm": arm(0.2 + d, 0), "rl": arm(0.3 + 1.5 * d, 4736), "rl_matched": arm(0.25 + 2 * d, 2048),
             "selfplay": arm(0.3 + 3 * d, 2000)} for seed, d in ((1, 0.0), (2, 0.02), (3, 0.05))]  # fmt: skip
    table = study.render({"results": {"runs": runs}})
    assert "| 1 | 0.200 (0.30 / 0.10) | 0.300 (0.40 / 0.20) | 0.250 (0.35 / 0.15) | 0.300 (0.40 / 0.20) | " \
           "4736 / 2048 / 2000 | 650 (0.29) | 0.85 / 0.45 | h0 | abcdef0 |" in table  # fmt: skip
    lines = {line.split(":")[0][2:]: line for line in table.splitlines() if line.startswith("- ")}
    assert set(lines) == {"self-play - warm start", "self-play - RL, same steps", "self-play - RL, same episodes",
                          "RL - warm start"}  # fmt: skip
    assert lines["self-play - warm start"].startswith("- self-play - warm start: +0.147, 95% t-interval")
    for line in lines.values():
        p, adjusted = (float(v) for v in re.findall(r"p = ([0-9.]+), Holm over these 4: ([0-9.]+)", line)[0])
        assert adjusted >= p
    assert [study.matched_steps(n) for n in (0, 63, 64, 2000, 4736)] == [1, 1, 1, 16, 37]
    # a run made before `rl_matched` existed (the pilot's JSON): its cells are "-", its comparisons left out
    older = study.render({"results": {"runs": [{k: v for k, v in r.items() if k != "rl_matched"} for r in runs]}})
    assert "| 0.300 (0.40 / 0.20) | - | 0.300 (0.40 / 0.20) | 4736 / - / 2000 |" in older
    assert "RL, same episodes:" not in older and "Holm over these 3:" in older


def _shape_run(arm: str, seed: int, after: float) -> dict:
    return {"arm": arm, "seed": seed, "steps": 150, "before": 0.1, "after": after, "train_score_last20": after,
            "generate_s": 0.5, "wall_s": 100.0, "forks": 0.0, "dropped": 0.0, "commit": "c" * 40, "clean": True,
            "host_id": "h1"}  # fmt: skip


def test_the_agent_shape_study_pairs_seeds_and_tests_equivalence(tmp_path):
    from studies import agent_shape_study as study

    afters = {1: (0.30, 0.32), 2: (0.40, 0.37), 3: (0.25, 0.27), 4: (0.50, 0.51)}  # (AgentInstance, SDK)
    runs = [_shape_run(arm, s, pair[k]) for s, pair in afters.items() for k, arm in enumerate(study.ARMS)]
    runs.append(_shape_run("OpenAI SDK", 5, 0.9))  # its twin never ran: left out of the pairs
    a = study.analyse(runs, margin=0.05)
    assert a["seeds"] == [1, 2, 3, 4] and a["diffs"] == pytest.approx([0.02, -0.03, 0.02, 0.01])
    assert a["mean"] == pytest.approx(0.005) and a["low"] < 0 < a["high"]
    assert (a["lower"], a["higher"]) == (1, 3) and a["p_tost"] < 0.05  # within +/-0.05
    payload = {"results": {"runs": runs}, "config": {"steps": 150, "margin": 0.05}}
    table = study.render(payload, tmp_path)
    assert "| 2 | 0.100 -> 0.400 | 0.100 -> 0.370 | -0.030 |" in table and "equivalent within the margin" in table
    assert (tmp_path / "agent_shape_study.md").read_text().strip() == table.strip()


def test_the_agent_endpoint_bench_splits_engine_time_from_the_rest_per_turn(tmp_path):
    from benchmarks import bench_agent_endpoint as bench

    def rollouts(rest_s: float) -> list[dict]:
        return [{"wall_s": 2.0 + rest_s, "engine_s": 2.0, "engine_calls": 4, "turns": 100, "model_tokens": 500}] * 3

    results = {"AgentInstance": bench.summarise(rollouts(0.1)), "OpenAI SDK": bench.summarise(rollouts(0.4))}
    assert results["AgentInstance"]["median_rest_ms_per_turn"] == pytest.approx(1.0)
    assert results["OpenAI SDK"]["median_rest_ms_per_turn"] == pytest.approx(4.0)
    payload = {"results": results, "commit": "c" * 40,
               "config": {"prompts": 16, "n": 4, "max_new_tokens": 8, "max_len": 128, "repeats": 4},
               "machine": {"cpu": "a CPU", "cpu_count": 2, "torch": "2.13.0+cpu"}}  # fmt: skip
    table = bench.render(payload, tmp_path)
    assert "+3.0 ms per model turn" in table and "| OpenAI SDK | 2.40 | 2.00 | 4.0 | 20.0 | 100 | 4 | 500 |" in table


def test_scratch_dir_goes_when_its_block_ends_and_stays_named_when_cut(tmp_path, monkeypatch, capsys):
    import tempfile

    from benchmarks.common import scratch_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with scratch_dir("bench_x_") as work:
        (work / "run" / "log.txt").parent.mkdir()
        (work / "run" / "log.txt").write_text("step 1")
        assert work.parent == tmp_path and work.name.startswith("bench_x_")
    assert list(tmp_path.iterdir()) == []

    with pytest.raises(KeyboardInterrupt), scratch_dir("bench_x_") as work:
        (work / "log.txt").write_text("step 1")
        raise KeyboardInterrupt
    assert (work / "log.txt").read_text() == "step 1"
    assert f"[bench_x] stopped: the unfinished run's files are in {work}" in capsys.readouterr().err


def test_bench_checkpoint_reads_a_save_s_cost_against_the_default_cadence(tmp_path):
    from benchmarks import bench_checkpoint

    payload = {"commit": "a" * 40, "created": "2026-12-06T00:00:00+00:00", "machine": {"cpu": "cpu"},
               "results": {"arms": [
                   {"arm": "none", "steps": 60, "median_step_s": 0.5, "saves": 0, "save_s_mean": None,
                    "checkpoint_mb": 0.0},
                   {"arm": "every step", "steps": 60, "median_step_s": 0.8, "saves": 60, "save_s_mean": 0.28,
                    "checkpoint_mb": 6.4}]}}  # fmt: skip
    text = bench_checkpoint.render(payload, tmp_path)
    assert "| every step | 60 | 0.800 | 60 | 0.280 | 6.4 |" in text and "| none | 60 | 0.500 | 0 | - | 0.0 |" in text
    # 0.3 s a save, one save per 300 s of 0.5 s steps: 0.3 x 0.5 / 300 = 0.5 ms a step, 0.10% of it
    assert "A save costs +0.300 s" in text and "a step pays 0.50 ms on average (0.10% of a step)" in text
    assert (tmp_path / "bench_checkpoint.md").read_text().strip() == text


def test_bench_routing_replay_splits_replays_cost_by_phase(tmp_path):
    from benchmarks import bench_routing_replay

    def arm(name, generate, experience, train):
        phases = {"generate": generate, "make_experience": experience, "train": train, "weight_sync": 0.05}
        phases["step"] = sum(phases.values())
        return {"arm": name, "steps": 40, "median_s": phases, "response_tokens_per_step": 180.0, "step_s": []}

    payload = {"commit": "b" * 40, "created": "2026-12-06T00:00:00+00:00", "machine": {"cpu": "cpu"},
               "results": {"arms": [arm("none", 0.20, 0.10, 0.30), arm("r3", 0.22, 0.18, 0.31)]}}  # fmt: skip
    text = bench_routing_replay.render(payload, tmp_path)
    assert "| none | 40 | 0.200 | 0.100 | 0.300 | 0.050 | 0.650 | 180 |" in text
    # 0.76 - 0.65 = 0.11 s a step, 16.9% of it: +0.02 capture, +0.08 the second old forward, +0.01 replayed train
    assert "per step: +0.110 s (+16.9% of a step): generate +0.020 s, make_experience +0.080 s, train +0.010 s" in text
    assert (tmp_path / "bench_routing_replay.md").read_text().strip() == text


def test_bench_gap_sources_batched_trainer_layout_matches_one_row_at_a_time_and_renders(tmp_path):
    """The batched forward lays rows out as the trainer does (prompts left-, responses right-padded): in fp32 it
    gives each row's log-probs of one-row forwards to float noise, and the table has a row per source."""
    import torch

    from benchmarks import bench_gap_sources as bench
    from reinforce_pro.models.tiny import build_tiny_model

    model = str(build_tiny_model(tmp_path / "tiny", seed=0))
    rows = [([1, 21, 15], [5, 8, 2, 9]), ([1, 30, 31, 32, 22], [7]), ([1, 4], [6, 6, 3])]
    one, batched = bench.hf_rows(model, rows, torch.float32), bench.hf_batched(model, rows, micro=2)
    assert [len(x) for x in batched] == [4, 1, 3]
    assert max((a - b).abs().max().item() for a, b in zip(one, batched, strict=True)) < 1e-5
    rounded = bench.hf_rows(model, rows, torch.float32, round_bf16=True)
    assert any((a - b).abs().max().item() > 0 for a, b in zip(one, rounded, strict=True))  # the rounding changes them
    stats = {"tokens": 8, "mean": 1e-3, "p99": 2e-3, "max": 3e-3, "bias": -1e-4}
    result = {"tokens": 8, "responses": 3, "rows": {name: {"a": a, "b": b, **stats} for name, a, b in bench.ROWS}}
    payload = {"results": {"embedded": {"0": result, "1": result}}, "machine": {"cpu": "x", "cpu_count": 2,
               "torch": "t"}, "commit": "abc", "created": "now", "config": {}}  # fmt: skip
    text = bench.render(payload, tmp_path)
    assert text.count("| 1.0e-03, 1.0e-03 | 2.0e-03 | 3.0e-03 | -1.0e-04 |") == len(bench.ROWS)
    assert "seeds 0, 1" in text and (tmp_path / "bench_gap_sources.md").is_file()
