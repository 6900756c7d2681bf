"""Where routing drift sits along a response, and at which band each correction's mask fires on it (exploratory
measurement: no training, no comparison of arms).

    python -m studies.moe_drift --seeds 1 2 3                      # writes studies/results/moe_drift_<task>.{json,md}
    python -m studies.moe_drift --render studies/results/moe_drift_running_sum.json

For each seed, as a run of `--embedded_model moe --builtin_task TASK` starts: the embedded MoE model warm-started
on the task with the task preset's settings; then a bf16 vLLM engine that records every token's experts
(rollout/route_capture.py) samples `--rows` responses (8 per prompt, temperature 1), and the fp32 trainer scores
them twice, routing itself (routing replay off) and with the engine's experts (r3, models/routing.py). The two
sides hold the same weights: everything measured is what the engine's bf16 kernels change, routing included.

Per seed it records
- the flip rate (the trainer's top-k expert set differs from the engine's) over the prompt's positions and by
  response-position bucket (routing/flip_frac's buckets);
- the log-prob gap |trainer - engine| by bucket, routing off and r3;
- around each row's first flipped response position f (a flip in any layer at the position that predicts
  response token f): the gap before f, at f and after it, against the rows with no flip at those positions:
  whether a flip's effect stays local or propagates through the KV cache to every later token;
- for each correction, the fraction of response tokens its mask drops, routing off and r3, at its default band
  and over a sweep of bands (ratio bands [1/(1+d), 1+d]; cppo's and dppo-tv's thresholds scaled), and the band
  whose fraction is nearest 2% (the 1-5% a screening wants a mask to act on).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.common import bench_main, run_provenance, scratch_dir
from studies import RESULTS_DIR as STUDY_RESULTS

CORRECTIONS = ("tis", "icepop", "seq-mask-tis", "reinforce_pro", "cppo", "dppo-tv")
RATIO_SWEEP = (4.0, 1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001)  # d of the band [1/(1+d), 1+d]
SCALE_SWEEP = (1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002)  # cppo's delta, delta_b; dppo-tv's low, high
SCALED = {"cppo": ("delta", "delta_b"), "dppo-tv": ("low", "high")}
OFFSETS = (("before", None, -1), ("at", 0, 0), ("+1..3", 1, 3), ("+4..15", 4, 15), ("+16..", 16, None))
TARGET_MASKED = 0.02


def warm_started_model(task: str, seed: int, workdir: Path) -> str:
    """The embedded MoE model after the warm start a run of `task` gives it (the task preset's settings)."""
    from reinforce_pro.cli.presets import PRESETS, TASK_PRESETS
    from reinforce_pro.data import EMBEDDED_TASKS
    from reinforce_pro.models.tiny import build_tiny_moe_model
    from reinforce_pro.trainer.sft_warmup import embedded_warm_start

    preset = PRESETS[TASK_PRESETS[task]]
    base = build_tiny_moe_model(workdir / "base", seed=seed, num_layers=EMBEDDED_TASKS[task]().model_layers)
    out = workdir / "warm"
    embedded_warm_start(task, base, out, preset["sft_warmup_steps"], seed, preset.get("sft_warmup_target", 0.0),
                        preset["max_new_tokens"])  # fmt: skip
    return str(out)


def sample_batch(model_dir: str, task: str, seed: int, rows: int):
    """`rows` responses of a bf16 engine that records routes, as Samples (routes included), with each row's
    reward and its group-centred advantage."""
    import torch
    from transformers import AutoTokenizer

    from reinforce_pro.cli.presets import PRESETS, TASK_PRESETS
    from reinforce_pro.data import EMBEDDED_TASKS
    from reinforce_pro.data.prompts import PromptConfig, build_prompts
    from reinforce_pro.rollout.sampler import RolloutConfig, Sampler
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine

    preset, spec = PRESETS[TASK_PRESETS[task]], EMBEDDED_TASKS[task]()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = build_prompts(spec.records(rows // 8, seed + 100), PromptConfig("input", "label"), tokenizer, task)
    cfg = RolloutConfig(8, preset["prompt_max_len"], preset["max_new_tokens"], temperature=1.0)
    sampler = Sampler(None, tokenizer, cfg)
    ids = [sampler.encode(p["prompt"]) for p in prompts for _ in range(8)]
    engine = VLLMEngine(EngineConfig(model_dir, "bfloat16", seed=seed, max_model_len=preset["max_len"],
                                     capture_routes=True))  # fmt: skip
    generations = engine.generate(ids, {"temperature": 1.0, "max_tokens": cfg.max_new_tokens})
    del engine
    texts = [p["prompt"] for p in prompts for _ in range(8)]
    labels = [p["label"] for p in prompts for _ in range(8)]
    samples = sampler.to_samples(ids, generations, texts, labels, torch.arange(len(ids)) // 8)
    rewards = torch.tensor([spec.score(r, lab) for r, lab in zip(samples.responses, labels, strict=True)])
    advantages = rewards - rewards.view(-1, 8).mean(-1).repeat_interleave(8)
    return samples, rewards, advantages


def score(model_dir: str, samples) -> dict:
    """The fp32 trainer's log-probs of the samples routing itself and replaying the engine's experts, and the
    flips (B, T, L) between its own routes and the engine's; also the flips over the prompts' positions."""
    import torch
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.routing import RouteReplay, RoutingPass
    from reinforce_pro.workers.base import batched_log_probs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    replay = RouteReplay.install(model)
    seq, attn, t = samples.sequences, samples.attention_mask, samples.num_actions
    out = {}
    for name, force in (("off", False), ("r3", True)):
        routing = RoutingPass(replay, samples.routes, force=force)
        out[name] = batched_log_probs(model, seq, attn, t, 1.0, micro=64, routing=routing)
        if not force:
            result = routing.result()
            out["flips"], own = result["flips"], result["own_routes"]
    prompt = attn.bool() & (samples.routes[..., 0, 0] >= 0)  # (B, S): positions the engine fed
    prompt[:, -t:] = False
    differ = (own.sort(-1).values != samples.routes.sort(-1).values).any(-1)  # (B, S, L)
    out["prompt_flip_frac"] = float(differ[prompt].float().mean())
    return out


def position_rows(gap_off, gap_r3, flips, action) -> dict:
    """Flip rate and gap by response-position bucket."""
    from reinforce_pro.algos.is_correction import position_buckets
    from reinforce_pro.algos.masked import masked_mean

    bucket, names = position_buckets(action)
    known = action & ~flips.isnan().any(-1)
    rows = {}
    for b, name in enumerate(names):
        where = known & (bucket == b)
        rows[name] = {
            "tokens": int(where.sum()),
            "flip_frac": float(masked_mean(flips.nan_to_num(0.0).mean(-1), where)),
            "gap_off": float(masked_mean(gap_off, where)),
            "gap_r3": float(masked_mean(gap_r3, where)),
        }
    return rows


def around_first_flip(gap_off, gap_r3, flips, action) -> dict:
    """The gap by offset from each flipped row's first flipped position, and the same positions' gap in the rows
    with no flip (the baseline): does the effect of a flip stay at it or carry on to later tokens?"""
    import torch

    from reinforce_pro.algos.masked import masked_mean

    flipped = (flips.nan_to_num(0.0).amax(-1) > 0) & action
    has = flipped.any(-1)
    first = torch.where(has, flipped.int().argmax(-1), -1)
    columns = torch.arange(action.size(-1)).unsqueeze(0)
    offset = columns - first.unsqueeze(-1)
    out = {"rows_with_flip": int(has.sum()), "rows": int(action.any(-1).sum())}
    for name, lo, hi in OFFSETS:
        band = (offset >= (lo if lo is not None else -(10**9))) & (offset <= (hi if hi is not None else 10**9))
        mine = action & has.unsqueeze(-1) & band
        # the rows without a flip, at the columns the flipped rows' band covers
        cols = mine.any(0, keepdim=True)
        base = action & ~has.unsqueeze(-1) & cols
        out[name] = {
            "tokens": int(mine.sum()),
            "gap_off": float(masked_mean(gap_off, mine)),
            "gap_r3": float(masked_mean(gap_r3, mine)),
            "baseline_gap_off": float(masked_mean(gap_off, base)),
        }
    return out


def masked_fractions(old, rollout, action, advantages) -> dict:
    """{correction: {"default": frac, "sweep": [(setting, frac)], "nearest": (setting, frac)}} for `old` log-probs."""
    from reinforce_pro.algos.is_correction import compute_is_weights, correction_params
    from reinforce_pro.algos.losses import DEFAULT_IS_THRESHOLD

    def frac(name, band, params=None):
        _, m = compute_is_weights(name, old, rollout, action, *band, advantages=advantages, params=params)
        return float(m["is/token_masked_frac"])

    out = {}
    for name in CORRECTIONS:
        default = frac(name, DEFAULT_IS_THRESHOLD)
        if name in SCALED:
            base = correction_params(name)
            sweep = [(f"x{s:g}", frac(name, DEFAULT_IS_THRESHOLD, {k: base[k] * s for k in SCALED[name]}))
                     for s in SCALE_SWEEP]  # fmt: skip
        else:
            sweep = [(f"[{1 / (1 + d):.4g}, {1 + d:.4g}]", frac(name, (1 / (1 + d), 1 + d))) for d in RATIO_SWEEP]
        nearest = min(sweep, key=lambda s: abs(s[1] - TARGET_MASKED))
        out[name] = {"default": default, "sweep": sweep, "nearest": nearest}
    return out


def measure_seed(task: str, seed: int, rows: int) -> dict:
    import torch

    with scratch_dir("moe_drift_") as workdir:
        model_dir = warm_started_model(task, seed, workdir)
        samples, rewards, advantages = sample_batch(model_dir, task, seed, rows)
        scored = score(model_dir, samples)
    action, rollout = samples.action_mask.bool(), samples.rollout_log_probs
    gap_off, gap_r3 = (scored["off"] - rollout).abs(), (scored["r3"] - rollout).abs()
    finite = torch.isfinite(gap_off) & torch.isfinite(gap_r3)
    action = action & finite
    flips = scored["flips"]
    known = action.unsqueeze(-1) & ~flips.isnan()
    return {
        "seed": seed,
        "provenance": run_provenance(),
        "rows": len(rewards),
        "reward_mean": float(rewards.mean()),
        "response_tokens": int(action.sum()),
        "prompt_flip_frac": scored["prompt_flip_frac"],
        "flip_frac": float(flips.nan_to_num(0.0)[known].mean()),
        "gap_off": float(gap_off[action].mean()),
        "gap_r3": float(gap_r3[action].mean()),
        "by_position": position_rows(gap_off, gap_r3, flips, action),
        "around_first_flip": around_first_flip(gap_off, gap_r3, flips, action),
        "masked_off": masked_fractions(scored["off"], rollout, action, advantages),
        "masked_r3": masked_fractions(scored["r3"], rollout, action, advantages),
    }


def render(payload: dict, out_dir: Path) -> str:
    """The page: per seed the headline numbers, then the means over seeds by position, around a flip, and of
    each mask."""
    runs, task = payload["results"], payload["config"]["task"]
    mean = lambda values: statistics.fmean(values)  # noqa: E731
    lines = [f"# Routing drift on the embedded MoE model, task {task} (exploratory)", "",
             f"{len(runs)} seeds x {payload['config']['rows']} responses; bf16 engine, fp32 trainer, same weights "
             f"(commit {payload['commit'][:12]}, host {runs[0]['provenance']['host_id']}).", "",
             "| seed | reward | response tokens | flip frac (prompt) | flip frac (response) | gap off | gap r3 |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        lines.append(f"| {r['seed']} | {r['reward_mean']:.3f} | {r['response_tokens']} | {r['prompt_flip_frac']:.4f} "
                     f"| {r['flip_frac']:.4f} | {r['gap_off']:.2e} | {r['gap_r3']:.2e} |")  # fmt: skip
    lines += ["", "## By response position (mean over seeds)", "",
              "| positions | flip frac | gap off | gap r3 |", "|---|---|---|---|"]  # fmt: skip
    for name in runs[0]["by_position"]:
        cells = [r["by_position"].get(name) for r in runs]
        cells = [c for c in cells if c and c["tokens"]]
        flip, off, r3 = (mean([c[k] for c in cells]) for k in ("flip_frac", "gap_off", "gap_r3"))
        lines.append(f"| {name} | {flip:.4f} | {off:.2e} | {r3:.2e} |")
    lines += _around_rows(runs, mean) + _mask_rows(runs)
    text = "\n".join(lines) + "\n"
    (out_dir / f"moe_drift_{task}.md").write_text(text)
    return text


def _around_rows(runs, mean) -> list[str]:
    rows = [r["around_first_flip"] for r in runs]
    lines = ["", f"## Around each row's first flip ({sum(r['rows_with_flip'] for r in rows)} of "
             f"{sum(r['rows'] for r in rows)} rows have one; mean over seeds)", "",
             "| offset | tokens | gap off (flipped rows) | gap off (rows without a flip, same columns) | gap r3 |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, _, _ in OFFSETS:
        cells = [r[name] for r in rows if r[name]["tokens"]]
        if cells:
            lines.append(f"| {name} | {sum(c['tokens'] for c in cells)} | {mean([c['gap_off'] for c in cells]):.2e} "
                         f"| {mean([c['baseline_gap_off'] for c in cells]):.2e} | "
                         f"{mean([c['gap_r3'] for c in cells]):.2e} |")  # fmt: skip
    return lines


def _mask_rows(runs) -> list[str]:
    lines = ["", "## Masked fraction of response tokens (mean over seeds)", "",
             "| correction | default band, off | default band, r3 | band nearest 2% (off) | there, off | there, r3 |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name in CORRECTIONS:
        if name == "tis":  # truncates weights, never drops a token
            lines.append("| `tis` | never masks | | | | |")
            continue
        off = [r["masked_off"][name] for r in runs]
        r3 = [r["masked_r3"][name] for r in runs]
        sweep = [statistics.fmean(s[i][1] for s in (o["sweep"] for o in off)) for i in range(len(off[0]["sweep"]))]
        i = min(range(len(sweep)), key=lambda k: abs(sweep[k] - TARGET_MASKED))
        there_r3 = statistics.fmean(o["sweep"][i][1] for o in r3)
        lines.append(f"| `{name}` | {statistics.fmean(o['default'] for o in off):.2%} | "
                     f"{statistics.fmean(o['default'] for o in r3):.2%} | {off[0]['sweep'][i][0]} | {sweep[i]:.2%} | "
                     f"{there_r3:.2%} |")  # fmt: skip
    return lines


def options(p) -> None:
    p.add_argument("--task", default="running_sum", choices=("arithmetic", "running_sum"))
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--rows", type=int, default=256, help="responses per seed (8 per prompt)")


def measured(args) -> tuple[dict, list]:
    runs = []
    for seed in args.seeds:
        runs.append(measure_seed(args.task, seed, args.rows))
        print(f"[moe_drift] seed {seed}: flip frac {runs[-1]['flip_frac']:.4f}, gap off {runs[-1]['gap_off']:.2e}, "
              f"r3 {runs[-1]['gap_r3']:.2e}", flush=True)  # fmt: skip
    config = {"task": args.task, "seeds": args.seeds, "rows": args.rows, "engine": "bfloat16", "trainer": "float32"}
    return config, runs


def main(argv=None) -> int:
    name = lambda args: f"moe_drift_{args.task}"  # noqa: E731
    return bench_main(argv, name, __doc__, options, measured, render, output=STUDY_RESULTS)


if __name__ == "__main__":
    raise SystemExit(main())
