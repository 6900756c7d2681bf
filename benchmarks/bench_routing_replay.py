"""What routing replay costs a step on the MoE model: the embedded MoE default without replay and with
--routing_replay r3, one run after the other in one invocation, and where the difference goes.

Runs on: CPU (the embedded MoE default: a tiny Qwen3-MoE, Ray, vLLM's CPU build, DeepSpeed).
Takes:   ~4 minutes on 2 cores with the defaults (two runs of 40 steps, no warm start, each engine's start).

    python -m benchmarks.bench_routing_replay                   # measure, write JSON, render the table
    python -m benchmarks.bench_routing_replay --render FILE     # re-render from a JSON

Both runs are `--embedded_model moe --aux_loss_coef 0.001` with --sft_warmup_steps 0 and the same seed. Under
`r3` the engine records each sampled token's experts (a forward hook on every MoE layer's router), the rows carry
them to the trainer, the old-log-prob and training forwards replay them, and the old forward runs a second time
routing itself, to log the gap replay closes (routing/logprob_abs_diff_unreplayed_mean). The per-phase medians
say which of these the difference is: time/generate holds the capture, time/make_experience the second old
forward, time/train the replayed training forward. The first 5 steps of each run are left out (start-up).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.common import arms_main, run_cli

MOE = ["--embedded_model", "moe", "--aux_loss_coef", "0.001", "--sft_warmup_steps", "0"]
ARMS = {"none": [], "r3": ["--routing_replay", "r3"]}
PHASES = ("generate", "make_experience", "train", "weight_sync", "step")
SKIP = 5  # start-up steps left out of the medians


def run_arm(name: str, steps: int, seed: int, workdir: Path) -> dict:
    """One run: the median seconds of each phase over its steps after SKIP, and its response tokens per step."""
    rows, _ = run_cli([*MOE, "--seed", str(seed), "--max_samples", str(32 * steps), "--auto_checkpoint_minutes", "0",
                       *ARMS[name]], workdir / name)  # fmt: skip
    kept = [r for r in rows if r.get("step", 0) > SKIP]
    medians = {phase: statistics.median(r[f"time/{phase}"] for r in kept) for phase in PHASES}
    tokens = statistics.fmean(r["perf/tokens_per_s"] * r["time/step"] for r in kept)
    return {"arm": name, "steps": len(rows), "median_s": medians, "response_tokens_per_step": tokens,
            "step_s": [r["time/step"] for r in kept]}  # fmt: skip


def render(payload: dict, out_dir: Path) -> str:
    arms = {r["arm"]: r for r in payload["results"]["arms"]}
    none, r3 = arms["none"], arms["r3"]
    lines = ["| arm | steps | " + " | ".join(f"median {p} (s)" for p in PHASES) + " | response tokens / step |",
             "|---|---|" + "---|" * len(PHASES) + "---|"]  # fmt: skip
    for r in (none, r3):
        cells = " | ".join(f"{r['median_s'][p]:.3f}" for p in PHASES)
        lines.append(f"| {r['arm']} | {r['steps']} | {cells} | {r['response_tokens_per_step']:.0f} |")
    diff = {p: r3["median_s"][p] - none["median_s"][p] for p in PHASES}
    lines += ["", f"Replay (r3 - none) per step: {diff['step']:+.3f} s ({diff['step'] / none['median_s']['step']:+.1%}"
              f" of a step): generate {diff['generate']:+.3f} s, make_experience {diff['make_experience']:+.3f} s, "
              f"train {diff['train']:+.3f} s, weight sync {diff['weight_sync']:+.3f} s.", "",
              f"_{payload['machine'].get('cpu', '?')}, commit {payload['commit'][:9]}, {payload['created']}; "
              f"first {SKIP} steps of each run left out._"]  # fmt: skip
    text = "\n".join(lines)
    (out_dir / "bench_routing_replay.md").write_text(text + "\n")
    return text


def main(argv=None) -> int:
    return arms_main(argv, "bench_routing_replay", __doc__, ARMS, run_arm, render, 40, {"base": MOE, "skip": SKIP})


if __name__ == "__main__":
    raise SystemExit(main())
