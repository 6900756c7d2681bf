"""What the OpenAI-compatible endpoint costs an agent's rollout: the calculator agent as an AgentInstance (the
runner calls the engine directly) and as OpenAI-SDK code (every turn an HTTP request to the loopback endpoint,
batched there), on one vLLM engine, one after the other.

Runs on: CPU (the `cpu` extra: vLLM, fastapi, uvicorn, openai).
Takes:   ~3 minutes on 2 cores (one engine start, then `--repeats` rollouts of each shape, interleaved).

    python -m benchmarks.bench_agent_endpoint                   # measure, write JSON, render the table
    python -m benchmarks.bench_agent_endpoint --render FILE     # re-render from a JSON

One engine (rollout/vllm_engine.VLLMEngine, a Ray actor in a process of its own, called as the run's Sampler
calls it) on the embedded default's architecture, randomly initialised, fp32. Each rollout is `--prompts` x
`--n` calculator episodes of up to 4 turns, at most `--max_new_tokens` tokens a turn, through
agents/agent_source.AgentSource
(examples/python/agent_calculator.py) or agents/openai_agents.OpenAIAgentSource
(examples/python/agent_calculator_openai.py). The engine calls are timed where they are made, so each rollout
splits into the engine's own time and the rest (the agent loop; for the SDK shape also the HTTP requests, the
batcher's waits and the endpoint's tokenisation). Reported: medians over the repeats after the first, of the
rollout's wall time, its engine time, the rest per model turn, and engine calls per rollout. The two shapes
sample different tokens (a random model; the engines' batches differ), so the comparison is per turn.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks.common import bench_main

ROOT = Path(__file__).resolve().parent.parent

NAME = "bench_agent_endpoint"
EXAMPLES = ROOT / "examples" / "python"
SHAPES = ("AgentInstance", "OpenAI SDK")


class TimedEngine:
    """The engine actor's generate, as the run's Sampler calls it, each call's seconds and prompts recorded."""

    def __init__(self, engine):
        self.engine, self.seconds, self.prompts = engine, [], []

    def sample(self, prompt_ids: list[list[int]], sampling: dict, engines=None) -> list:
        import ray

        start = time.perf_counter()
        out = ray.get(self.engine.generate.remote(prompt_ids, sampling))
        self.seconds.append(time.perf_counter() - start)
        self.prompts.append(len(prompt_ids))
        return out


def sources(engine: TimedEngine, tokenizer, args) -> dict:
    from reinforce_pro.agents.agent_file import load_agent
    from reinforce_pro.agents.agent_source import AgentSource
    from reinforce_pro.agents.contract import load_agent_class
    from reinforce_pro.agents.openai_agents import OpenAIAgentSource
    from reinforce_pro.agents.runner import AgentConfig
    from reinforce_pro.rollout.sampler import RolloutConfig

    cfg = RolloutConfig(max_new_tokens=args.max_new_tokens)
    sampler = SimpleNamespace(cfg=cfg, tokenizer=tokenizer, sample=engine.sample)
    agent_cfg = AgentConfig(max_len=args.max_len, max_turns=4)  # the SDK example's MAX_TURNS
    return {
        "AgentInstance": AgentSource(sampler, load_agent_class(EXAMPLES / "agent_calculator.py"), agent_cfg),
        "OpenAI SDK": OpenAIAgentSource(sampler, load_agent(EXAMPLES / "agent_calculator_openai.py"), agent_cfg),
    }


def one_rollout(source, engine: TimedEngine, batch: list[dict], n: int) -> dict:
    engine.seconds, engine.prompts = [], []
    start = time.perf_counter()
    samples = source.generate(batch, n)
    wall = time.perf_counter() - start
    turns = sum(engine.prompts)  # model turns: every prompt of every engine call
    tokens = int(samples.action_mask.sum())
    return {"wall_s": wall, "engine_s": sum(engine.seconds), "engine_calls": len(engine.seconds), "turns": turns,
            "model_tokens": tokens}  # fmt: skip


def measure(args) -> dict:
    import ray
    from transformers import AutoTokenizer

    from reinforce_pro.data.arithmetic import arithmetic_records
    from reinforce_pro.models.tiny import build_tiny_model
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine
    from reinforce_pro.workers.launcher import start_ray

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny", seed=0)
        tokenizer = AutoTokenizer.from_pretrained(model)
        start_ray(logical_cpus=4, quiet=True)
        cfg = EngineConfig(str(model), dtype="float32", max_model_len=args.max_len)
        actor = ray.remote(VLLMEngine).options(num_cpus=1).remote(cfg)  # a process of its own, as in a run
        engine = TimedEngine(actor)
        records = arithmetic_records(args.prompts * args.repeats, seed=7)
        shapes = sources(engine, tokenizer, args)
        runs = {shape: [] for shape in args.shapes}
        try:
            for r in range(args.repeats):  # interleaved: drift of the machine falls on both shapes alike
                batch = [{"prompt": x["input"], "label": x["label"]} for x in
                         records[r * args.prompts : (r + 1) * args.prompts]]  # fmt: skip
                for shape in args.shapes:
                    runs[shape].append(one_rollout(shapes[shape], engine, batch, args.n))
                    print(f"[{NAME}] repeat {r + 1}/{args.repeats} {shape}: {runs[shape][-1]}", flush=True)
        finally:
            shapes["OpenAI SDK"].close()
            ray.kill(actor)
            ray.shutdown()
    return {shape: {"rollouts": rollouts, **summarise(rollouts[1:])} for shape, rollouts in runs.items()}


def summarise(rollouts: list[dict]) -> dict:
    med = lambda key: statistics.median(key(r) for r in rollouts)  # noqa: E731
    return {
        "median_wall_s": med(lambda r: r["wall_s"]),
        "median_engine_s": med(lambda r: r["engine_s"]),
        "median_rest_ms_per_turn": med(lambda r: 1000 * (r["wall_s"] - r["engine_s"]) / r["turns"]),
        "median_engine_ms_per_turn": med(lambda r: 1000 * r["engine_s"] / r["turns"]),
        "median_turns": med(lambda r: r["turns"]),
        "median_engine_calls": med(lambda r: r["engine_calls"]),
        "median_model_tokens": med(lambda r: r["model_tokens"]),
    }


def render(payload: dict, out_dir: Path) -> str:
    r, c, m = payload["results"], payload["config"], payload["machine"]
    lines = [
        "| agent shape | rollout s | engine s | rest ms / turn | engine ms / turn | turns | engine calls | "
        "model tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for shape in [s for s in SHAPES if s in r]:
        s = r[shape]
        lines.append(
            f"| {shape} | {s['median_wall_s']:.2f} | {s['median_engine_s']:.2f} | {s['median_rest_ms_per_turn']:.1f} | "
            f"{s['median_engine_ms_per_turn']:.1f} | {s['median_turns']:.0f} | {s['median_engine_calls']:.0f} | "
            f"{s['median_model_tokens']:.0f} |"
        )
    hop = r["OpenAI SDK"]["median_rest_ms_per_turn"] - r["AgentInstance"]["median_rest_ms_per_turn"]
    lines += [
        "",
        f"The endpoint's cost over the direct runner: {hop:+.1f} ms per model turn. {c['prompts']} prompts x "
        f"{c['n']} calculator episodes per rollout, up to 4 turns of at most {c['max_new_tokens']} tokens, one fp32 "
        f"vLLM engine (the embedded architecture, random weights); medians of {c['repeats'] - 1} rollouts per shape "
        f"after one left out, the shapes interleaved. {m['cpu']} ({m['cpu_count']} cores), torch {m['torch']}, "
        f"commit {payload['commit'][:12]}{' with uncommitted changes' * payload['commit'].endswith('-dirty')}.",
    ]
    table = "\n".join(lines)
    (out_dir / f"{NAME}.md").write_text(table + "\n")
    return table


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=16, help="prompts per rollout")
    p.add_argument("--n", type=int, default=4, help="episodes per prompt")
    p.add_argument("--max_new_tokens", type=int, default=8, help="tokens per model turn, at most")
    p.add_argument("--max_len", type=int, default=128, help="tokens per episode, at most")
    p.add_argument("--repeats", type=int, default=8, help="rollouts of each shape (the first is left out)")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES, help="one shape alone: to profile")


def measured(args) -> tuple[dict, dict]:
    config = {k: getattr(args, k) for k in ("prompts", "n", "max_new_tokens", "max_len", "repeats", "shapes")}
    return config, measure(args)


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    sys.exit(main())
