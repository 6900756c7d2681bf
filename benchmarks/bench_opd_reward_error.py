"""How much of the rollout/training mismatch enters on-policy distillation's reward, by which log-probs it uses.

Runs on: CPU, 2 cores, nothing else running; the `models` extra for the SmolLM2-135M case.
Takes:   ~4 minutes with the defaults.

    python -m benchmarks.bench_opd_reward_error                 # measure, write JSON, render the table
    python -m benchmarks.bench_opd_reward_error --render FILE   # re-render from a JSON

The per-token reward of on-policy distillation is r_t = log T(y_t) - log S(y_t) for tokens y the student S
sampled. Its reference here is both terms from an fp32 HF forward. A bf16 vLLM engine samples the responses (the
main job's engine), and the reward is formed from each choice a run can make:
- student term: the trainer's old log-probs in fp32 (`--opd_student_logprobs trainer` with `--param_dtype fp32`:
  the reference itself), the trainer's in bf16 (`--param_dtype bf16`), or the engine's sampled log-probs in bf16
  (`--opd_student_logprobs engine`);
- teacher term: an fp32 actor (the reference), a bf16 actor, or a bf16 prefill-only engine (`--teacher_backend
  engine` with a bf16 run).
For each pair: the mean, p99 and max over the sampled tokens of |r - r_ref|, beside the mean |r_ref| (the signal).

Cases: `embedded`, the main job's student (the built-in model after its warm start) and its built-in teacher, on
256 arithmetic prompts; `smollm2`, SmolLM2-135M-Instruct as both student and teacher (self-distillation: the true
reward is 0 at every token, so every bit of r is error), on 64 chat-templated questions, 24 new tokens each.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.common import PACKAGED_MODELS, bench_main, scratch_dir, write_table

NAME = "bench_opd_reward_error"
STUDENT_CHOICES = ("trainer fp32", "trainer bf16", "engine bf16")
TEACHER_CHOICES = ("actor fp32", "actor bf16", "engine bf16")


def models(case: str, work: Path) -> tuple[str, str, list[list[int]], int]:
    """(student dir, teacher dir, prompt ids, max new tokens) of a case."""
    from transformers import AutoTokenizer

    if case == "embedded":
        from reinforce_pro.data import EMBEDDED_TASKS
        from reinforce_pro.models.tiny import build_tiny_model
        from reinforce_pro.run.teacher import builtin_teacher
        from reinforce_pro.trainer.sft_warmup import embedded_warm_start

        base = build_tiny_model(work / "base", seed=42)
        embedded_warm_start("arithmetic", base, work / "student", 600, 42, 0.2)  # the main job's warm start
        student, teacher = str(work / "student"), str(builtin_teacher("arithmetic"))
        tok = AutoTokenizer.from_pretrained(student)
        records = EMBEDDED_TASKS["arithmetic"]().records(256, 42)
        prompts = [[tok.bos_token_id] + tok(r["input"], add_special_tokens=False)["input_ids"] for r in records]
        return student, teacher, prompts, 6
    from reinforce_pro.models.packaged import prepare

    path = str(prepare("smollm2-135m-instruct", PACKAGED_MODELS / "smollm2-135m-instruct"))
    tok = AutoTokenizer.from_pretrained(path)
    questions = [f"What is {a} + {b}? Answer briefly." for a, b in zip(range(11, 75), range(40, 104), strict=True)]
    prompts = []
    for q in questions:  # token ids (transformers 5 hands back a mapping with them)
        out = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        prompts.append(list(out["input_ids"] if hasattr(out, "keys") else out))
    return path, path, prompts, 24


def hf_log_probs(path: str, rows: list[tuple[list[int], list[int]]], dtype) -> list:
    """Each row's response-token log-probs under an HF forward of prompt + response in `dtype`, one row at a time
    (no padding)."""
    from transformers import AutoModelForCausalLM

    return row_log_probs(AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval(), rows)


def row_log_probs(model, rows: list[tuple[list[int], list[int]]]) -> list:
    """hf_log_probs' forwards with a model already loaded (and changed: bench_gap_sources rounds its weights or
    gives it an fp32 head)."""
    import torch

    out = []
    with torch.no_grad():
        for prompt, response in rows:
            ids = torch.tensor([prompt + response])
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
            out.append(logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None])[:, 0])
    return out


def sample(path: str, prompts: list[list[int]], new_tokens: int, dtype: str, seed: int):
    """(engine, [(prompt, generation)], [(prompt, response ids)], max_model_len): a `dtype` vLLM engine of `path`
    samples each prompt once at temperature 1; empty responses are left out. The engine is returned for more work."""
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine

    max_len = max(map(len, prompts)) + new_tokens + 8
    engine = VLLMEngine(EngineConfig(model_path=path, dtype=dtype, max_model_len=max_len, seed=seed))
    generations = engine.generate(prompts, {"temperature": 1.0, "max_tokens": new_tokens})
    kept = [(p, g) for p, g in zip(prompts, generations, strict=True) if g.token_ids]
    return engine, kept, [(p, list(g.token_ids)) for p, g in kept], max_len


def prefill(engine, rows: list[tuple[list[int], list[int]]]) -> list:
    """Each row's response-token log-probs from `engine`'s prefill of prompt + response (VLLMEngine.score)."""
    import torch

    scored = engine.score([p + r for p, r in rows], [len(p) for p, _ in rows])
    return [torch.tensor(s, dtype=torch.float32) for s in scored]


def engine_prefill(path: str, rows, dtype: str, max_len: int, seed: int, name: str, fp32_head: bool = False) -> list:
    """prefill() by an engine of its own, stopped after."""
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine

    config = EngineConfig(model_path=path, dtype=dtype, max_model_len=max_len, seed=seed, fp32_head=fp32_head)
    engine = VLLMEngine(config, 0, name)
    scored = prefill(engine, rows)
    del engine
    return scored


def errors(case: str, seed: int) -> dict:
    import torch

    with scratch_dir("opd_reward_error_") as work:
        student, teacher, prompts, new_tokens = models(case, Path(work))
        sampler, kept, rows, max_len = sample(student, prompts, new_tokens, "bfloat16", seed)
        del sampler
        scored = engine_prefill(teacher, rows, "bfloat16", max_len, seed, "teacher")
        students = {
            "trainer fp32": hf_log_probs(student, rows, torch.float32),
            "trainer bf16": hf_log_probs(student, rows, torch.bfloat16),
            "engine bf16": [torch.tensor(g.log_probs, dtype=torch.float32) for _, g in kept],
        }
        teachers = {
            "actor fp32": hf_log_probs(teacher, rows, torch.float32),
            "actor bf16": hf_log_probs(teacher, rows, torch.bfloat16),
            "engine bf16": scored,
        }
    cat = {k: torch.cat(v) for k, v in {**{f"S {k}": v for k, v in students.items()},
                                         **{f"T {k}": v for k, v in teachers.items()}}.items()}  # fmt: skip
    reference = cat["T actor fp32"] - cat["S trainer fp32"]
    out = {"tokens": int(reference.numel()), "responses": len(rows), "signal_mean_abs": float(reference.abs().mean()),
           "signal_mean": float(reference.mean()), "pairs": {}}  # fmt: skip
    for s in STUDENT_CHOICES:
        for t in TEACHER_CHOICES:
            err = (cat[f"T {t}"] - cat[f"S {s}"] - reference).abs()
            err = err[torch.isfinite(err)]
            out["pairs"][f"{s} | {t}"] = {
                "mean": float(err.mean()), "p99": float(err.quantile(0.99)), "max": float(err.max()),
                "bias": float((cat[f"T {t}"] - cat[f"S {s}"] - reference).nan_to_num().mean()),
            }  # fmt: skip
    return out


def render(payload: dict, out_dir: Path) -> str:
    lines = [
        "The per-token distillation reward's error |r - r_ref| against both terms from an fp32 HF forward, on "
        "responses a bf16 engine sampled",
    ]
    for case, r in payload["results"].items():
        lines += [
            "",
            f"**{case}**: {r['responses']} responses, {r['tokens']} tokens; the signal, mean |r_ref| = "
            f"{r['signal_mean_abs']:.3g} (mean r_ref {r['signal_mean']:.3g})",
            "",
            "| student term | teacher term | mean | p99 | max | mean error / mean signal |",
            "|---|---|---|---|---|---|",
        ]
        for pair, e in r["pairs"].items():
            s, t = pair.split(" | ")
            share = f"{e['mean'] / r['signal_mean_abs']:.1%}" if r["signal_mean_abs"] else "- (no signal)"
            lines.append(f"| {s} | {t} | {e['mean']:.1e} | {e['p99']:.1e} | {e['max']:.1e} | {share} |")
    return write_table(payload, lines, out_dir, NAME)


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", nargs="*", default=["embedded", "smollm2"], choices=["embedded", "smollm2"])
    p.add_argument("--seed", type=int, default=0)


def measured(args) -> tuple[dict, dict]:
    config = {"cases": args.cases, "seed": args.seed}
    return config, {case: errors(case, args.seed) for case in args.cases}


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
