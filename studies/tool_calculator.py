"""Does the built-in model learn to call a function tool? The calculator with `add` as a function tool (chat
route, `tools=`, parsed `tool_calls`) against the same calculator in the text protocol (`calc(a+b)` in a
completion), trained by train_ppo_ray at paired seeds and scored on held-out additions before and after RL.

Runs on: CPU (the `cpu` extra).
Takes:   ~10 minutes a run on 2 cores alone (a 1200-step warm start, `--steps` RL steps, two evaluations).

    python -m studies.tool_calculator --seeds 42,1,2            # run (resumable), write JSON, render
    python -m studies.tool_calculator --render FILE             # re-render from a JSON

The task: additions a+b with a, b <= 99, beyond what the 0.4M-parameter model adds reliably in its head, so a
tool pays. The reward of both example agents: 1.0 for a right answer without the tool, 0.8 with it, 0.0
otherwise. The arms:
- `tools`: examples/python/agent_calculator_tools.py. The chat template renders the tool ("tools: add(a, b)");
  a call is `<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>`, parsed by the endpoint;
  the result comes back as a `tool` message.
- `text`: examples/python/agent_calculator_openai.py. A call is `calc(3+4)` in a completion; the agent
  appends " -> 7; answer: ".
The built-in model has never seen a tool, so each arm's warm start (per seed, the same records and the same
choice of which get a tool demonstration) shows it both ways in its own format: half the records as a direct
answer, half as a call, then the answer after the result. Then `--steps` RL steps with the embedded default's
settings (reinforce_baseline, reinforce_pro, a bf16 engine, 32 prompts x 8), longer responses (a call is 56
characters). The endpoint: eval/held_out/score_mean (right answers, with or without the tool) over 64 held-out
additions x 4 episodes at temperature 0.6 after the last step, with the tool-call rate
(eval/held_out/logs/tool_calls, calls per episode) beside it; both are also read before RL. Paired by seed:
each arm's gain (after - before) and tools - text after RL, with 95% t-intervals and the direction seed by seed.
This is a screening at 3 seeds: it can show that an arm learns and how large the difference is, and a
"not separated" here is not equivalence. Each run records its commit, host and wall time.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import run_provenance, scratch_dir
from studies.runner import study_main
from studies.study_stats import direction, paired_test

NAME = "tool_calculator"
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "python"
ARMS = {"tools": EXAMPLES / "agent_calculator_tools.py", "text": EXAMPLES / "agent_calculator_openai.py"}
MAX_OPERAND = 99
HELD_OUT_SEED = 1234
TOOL_SHARE = 0.5  # of the warm start's records shown as a call, then the answer after the result
WARM_TARGET = 0.5  # greedy episode accuracy at which each arm's warm start stops (see warm_start)
SCORE, CALLS = "eval/held_out/score_mean", "eval/held_out/logs/tool_calls"
# the embedded default's RL settings (cli/presets.py EMBEDDED), with room for a call and its result
ROOM = {"max_new_tokens": 96, "max_len": 256, "prompt_max_len": 64}  # a call is 72 characters


def rl_flags() -> list[str]:
    """The embedded default's flags, less its warm start and length (the study warm-starts each arm itself)."""
    from reinforce_pro.cli.presets import EMBEDDED

    flags = ["--label_key", "label", "--input_key", "input"]
    for key, value in {**EMBEDDED, **ROOM}.items():
        if key in ("sft_warmup_steps", "sft_warmup_target", "max_samples"):
            continue
        if value is True:
            flags.append(f"--{key}")
        elif isinstance(value, list | tuple):
            flags += [f"--{key}", *map(str, value)]
        else:
            flags += [f"--{key}", str(value)]
    return flags


def records(n: int, seed: int) -> list[dict]:
    from reinforce_pro.data.arithmetic import arithmetic_records

    return arithmetic_records(n, seed, MAX_OPERAND, MAX_OPERAND)


def demonstrations(arm: str, n: int, seed: int, tokenizer) -> list[dict]:
    """The warm start's {"prompt", "label"} examples of `arm`: each record as a direct answer, or (TOOL_SHARE of
    them, the same ones in both arms) as a call and then the answer after its result, written as the agent
    and the endpoint write them (the prompt without the <bos> the warm start adds)."""
    rng, out = random.Random(seed), []
    for r in records(n, seed):
        a, b = (int(x) for x in r["input"].rstrip("=").split("+"))
        tool = rng.random() < TOOL_SHARE
        if arm == "text":
            prompt = r["input"]
            out += [{"prompt": prompt, "label": f"calc({a}+{b})"},
                    {"prompt": f"{prompt}calc({a}+{b}){tokenizer.eos_token} -> {r['label']}; answer: ",
                     "label": r["label"]}] if tool else [{"prompt": prompt, "label": r["label"]}]  # fmt: skip
        else:
            direct = {"prompt": _chat(tokenizer, [{"role": "user", "content": r["input"]}]), "label": r["label"]}
            out += _tool_demonstration(tokenizer, r, a, b) if tool else [direct]
    return out


def _tool_demonstration(tokenizer, record: dict, a: int, b: int) -> list[dict]:
    call = f"<tool_call>{json.dumps({'name': 'add', 'arguments': {'a': a, 'b': b}})}</tool_call>"
    user = {"role": "user", "content": record["input"]}
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "demo", "type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}]}  # fmt: skip
    result = {"role": "tool", "tool_call_id": "demo", "content": record["label"]}
    after = _chat(tokenizer, [user, assistant, result], {"demo": call})
    return [{"prompt": _chat(tokenizer, [user]), "label": call}, {"prompt": after, "label": record["label"]}]


def _chat(tokenizer, messages: list[dict], sampled: dict | None = None) -> str:
    """The prompt the endpoint renders for the tools agent, without its leading <bos>."""
    from reinforce_pro.agents.tools import ToolRequest, render_chat

    tools = ToolRequest([_add_tool()])
    return render_chat(tokenizer, messages, tools, sampled or {}).removeprefix(tokenizer.bos_token)


def _add_tool() -> dict:
    import importlib.util

    spec = importlib.util.spec_from_file_location("tools_agent", ARMS["tools"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ADD


def warm_start(arm: str, seed: int, steps: int, workdir: Path) -> tuple[str, dict]:
    """The arm's warm start from the seed's base model: up to `steps` SFT steps, stopped at the first check
    (every 100 steps) where greedy episodes on 64 training additions (drawn with seed + 2) score WARM_TARGET.
    The model learns to copy the operands into a call at a step that differs by seed and by format (the JSON
    call writes them ~45 characters after the prompt, `calc(` right after it), so a fixed step count would
    compare a model that can call its tool with one that cannot."""
    from transformers import AutoTokenizer

    from reinforce_pro.models.tiny import build_tiny_model
    from reinforce_pro.trainer.sft_warmup import AccuracyStop, sft_warm_start

    base = build_tiny_model(workdir / f"base_{seed}", seed=seed, max_positions=256)
    tokenizer = AutoTokenizer.from_pretrained(base)
    examples = demonstrations(arm, 4096, seed + 1, tokenizer)
    out = workdir / f"warm_{arm}_{seed}"
    probe = records(64, seed + 2)
    stop = AccuracyStop(lambda model, tok: episode_accuracy(arm, model, tok, probe), WARM_TARGET, every=100)
    stats = sft_warm_start(base, out, examples, steps=steps, seed=seed, stop=stop)
    return str(out), {k: float(v) for k, v in stats.items() if isinstance(v, int | float)}


def episode_accuracy(arm: str, model, tokenizer, probe: list[dict]) -> float:
    """Greedy two-turn episodes of `arm` on the HF model: the reply, and where it is a call the agent would
    run, the answer after the tool's result; the share answered right (with or without the tool)."""
    import re

    from reinforce_pro.trainer.sft_warmup import greedy_sampler

    model.eval()
    sample = greedy_sampler(model, tokenizer)

    def replies(texts: list[str]) -> list[str]:
        ids = [[tokenizer.bos_token_id] + tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        return tokenizer.batch_decode([g.token_ids for g in sample(ids, {"max_tokens": 96})], skip_special_tokens=True)

    firsts = [r["input"] if arm == "text" else _chat(tokenizer, [{"role": "user", "content": r["input"]}])
              for r in probe]  # fmt: skip
    right, seconds, labels = 0, [], []
    pattern = re.compile(r"calc\((\d+)\+(\d+)\)" if arm == "text" else r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    for r, first, reply in zip(probe, firsts, replies(firsts), strict=True):
        operands = _operands(arm, pattern.search(reply))
        if operands is None:
            right += reply.strip() == r["label"]
            continue
        result = str(sum(operands))
        env = f" -> {result}; answer: " if arm == "text" else f"\ntool: {result}\nassistant: "
        seconds.append(first + reply + tokenizer.eos_token + env)
        labels.append(r["label"])
    right += sum(a.strip() == label for a, label in zip(replies(seconds) if seconds else [], labels, strict=True))
    model.train()
    return right / len(probe)


def _operands(arm: str, match) -> tuple[int, int] | None:
    if match is None:
        return None
    if arm == "text":
        return int(match.group(1)), int(match.group(2))
    try:
        arguments = json.loads(match.group(1))["arguments"]
        return int(arguments["a"]), int(arguments["b"])
    except (ValueError, KeyError, TypeError):
        return None


def write_data(workdir: Path) -> tuple[Path, Path]:
    train, held = workdir / "train.jsonl", workdir / "held_out.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in records(4096, 42)))
    held.write_text("".join(json.dumps(r) + "\n" for r in records(64, HELD_OUT_SEED)))
    return train, held


def run_one(arm: str, seed: int, steps: int, sft_steps: int, workdir: Path, outputs: tuple[Path, ...]) -> dict:
    train, held = write_data(workdir)
    start = time.time()
    model, sft = warm_start(arm, seed, sft_steps, workdir)
    run_dir = workdir / f"{arm}_{seed}"
    command = [
        sys.executable, "-m", "reinforce_pro.cli.train_ppo_ray", *rl_flags(), "--pretrain", model,
        "--prompt_data", str(train), "--agent_func_path", str(ARMS[arm]), "--seed", str(seed),
        "--max_samples", str(32 * steps), "--eval_dataset", str(held), "--eval_steps", str(steps),
        "--eval_before_training", "--save_path", str(run_dir),
    ]  # fmt: skip
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env={**os.environ})
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if SCORE in r]
    steps_rows = [r for r in rows if "time/step" in r]
    return {
        "arm": arm, "seed": seed, "steps": len(steps_rows), "sft": sft,
        "before": evals[0][SCORE], "after": evals[-1][SCORE],
        "calls_before": evals[0].get(CALLS, 0.0), "calls_after": evals[-1].get(CALLS, 0.0),
        "train_score_first10": statistics.fmean(r["rollout/score_mean"] for r in steps_rows[:10]),
        "train_score_last10": statistics.fmean(r["rollout/score_mean"] for r in steps_rows[-10:]),
        "parse_failures": sum(r.get("agent/tool_call_failures", 0.0) for r in steps_rows),
        "forks": sum(r.get("agent/segment_forks", 0.0) for r in steps_rows),
        "dropped": sum(r.get("agent/dropped_episodes", 0.0) for r in steps_rows),
        "wall_s": time.time() - start, **run_provenance(ROOT, ignore=outputs),
    }  # fmt: skip


def analyse(runs: list[dict]) -> dict:
    by = {(r["arm"], r["seed"]): r for r in runs}
    seeds = sorted({s for _, s in by if all((arm, s) in by for arm in ARMS)})
    out = {"seeds": seeds}
    comparisons = {f"{arm}: after - before": [by[(arm, s)]["after"] - by[(arm, s)]["before"] for s in seeds]
                   for arm in ARMS}  # fmt: skip
    comparisons.update({f"{arm}: tool calls after - before": [by[(arm, s)]["calls_after"] - by[(arm, s)]["calls_before"]
                        for s in seeds] for arm in ARMS})  # fmt: skip
    comparisons["tools - text, after"] = [by[("tools", s)]["after"] - by[("text", s)]["after"] for s in seeds]
    for name, diffs in comparisons.items():
        row = {"diffs": diffs}
        if len(diffs) >= 2:
            t, d = paired_test(diffs), direction(diffs)
            row.update(mean=t.mean, low=t.low, high=t.high, p_t=t.p_t, lower=d.lower, higher=d.higher,
                       p_sign_flip=d.p_sign_flip)  # fmt: skip
        out[name] = row
    return out


def render(payload: dict, out_dir: Path) -> str:
    runs, config = payload["results"]["runs"], payload["config"]
    a = analyse(runs)
    by = {(r["arm"], r["seed"]): r for r in runs}
    lines = ["| seed | arm | warm-start steps (greedy episodes) | held-out score before -> after | tool calls / "
             "episode before -> after | train score (last 10 steps) | unparsed calls | minutes |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for s in a["seeds"]:
        for arm in ARMS:
            r = by[(arm, s)]
            warm = f"{r['sft']['sft/steps']:.0f} ({r['sft'].get('sft/stop_accuracy', float('nan')):.2f})"
            lines.append(f"| {s} | {arm} | {warm} | {r['before']:.3f} -> {r['after']:.3f} | {r['calls_before']:.2f} -> "
                         f"{r['calls_after']:.2f} | {r['train_score_last10']:.3f} | {r['parse_failures']:.0f} | "
                         f"{r['wall_s'] / 60:.1f} |")  # fmt: skip
    lines += ["", "| paired by seed | per seed | mean [95% t-interval] | lower / higher seeds (sign-flip p) |",
              "|---|---|---|---|"]  # fmt: skip
    for name, row in a.items():
        if name == "seeds" or "mean" not in row:
            continue
        per_seed = ", ".join(f"{d:+.3f}" for d in row["diffs"])
        lines.append(f"| {name} | {per_seed} | {row['mean']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}] | "
                     f"{row['lower']} / {row['higher']} ({row['p_sign_flip']:.2f}) |")  # fmt: skip
    hosts, commits = sorted({r["host_id"] for r in runs}), sorted({r["commit"][:12] for r in runs})
    lines.append(
        f"\n{config['steps']} RL steps per run after a warm start stopped at greedy episode accuracy "
        f"{config.get('warm_target', WARM_TARGET)} (or {config['sft_steps']} steps); {SCORE} and {CALLS} "
        f"over 64 held-out additions (a, b <= {MAX_OPERAND}) x 4 episodes at temperature 0.6. {len(runs)} runs "
        f"({sum(r['clean'] for r in runs)} from a clean tree) on host(s) {', '.join(hosts)}; commits "
        f"{', '.join(commits)}. Forks: {sum(r['forks'] for r in runs):.0f}; dropped episodes: "
        f"{sum(r['dropped'] for r in runs):.0f}. Screening: 3 seeds, t-intervals and exact sign-flip p, no "
        'multiplicity correction; "not separated" is not equivalence.'
    )
    table = "\n".join(lines)
    (out_dir / f"{NAME}.md").write_text(table + "\n")
    return table


def run(args, study) -> None:
    config = {"steps": args.steps, "sft_steps": args.sft_steps, "max_operand": MAX_OPERAND, "tool_share": TOOL_SHARE,
              "warm_target": WARM_TARGET}  # fmt: skip
    runs = study.stored()
    outputs = (study.path, study.path.with_suffix(".md"))
    with scratch_dir("tool_calculator_") as workdir:
        for seed in args.seeds:
            for arm in args.arms.split(","):
                if any(r["arm"] == arm and r["seed"] == seed for r in runs):
                    continue
                print(f"[{NAME}] {arm} seed {seed}", flush=True)
                runs.append(run_one(arm, seed, args.steps, args.sft_steps, workdir, outputs))
                study.save(runs, config)


def options(p) -> None:
    p.add_argument("--sft_steps", type=int, default=3000, help="warm-start steps per run at most")
    p.add_argument("--arms", default=",".join(ARMS), help="arms to run (default: both)")


def main(argv=None) -> int:
    return study_main(argv, __doc__, NAME, run, render, options=options, seeds="42,1,2", steps=60)


if __name__ == "__main__":
    raise SystemExit(main())
