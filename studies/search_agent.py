"""Does search-augmented RL learn? Held-out answer accuracy with search, before and after RL, against
the same model answering without search.

    python -m studies.search_agent --seeds 1-3 --steps 60
    python -m studies.search_agent --seeds 1 --steps 0      # the warm start alone, with and without search
    python -m studies.search_agent --seeds 1-2 --agent openai   # RL through the same agent written to the OpenAI SDK
    python -m studies.search_agent --render studies/results/search_agent.json

Seeds already in the output JSON with the same settings are kept, not rerun: an interrupted study resumes.

Per seed: a generated knowledge base (reinforce_pro.search.knowledge: invented people, their home / tool /
mentor; train and held-out people share no fact), its BM25 service on loopback, and the built-in tiny Qwen2
(512 positions) warm-started on demonstrations of a share of the train questions (search turns, the service's
real answers, the answer turn; reinforce_pro.search.demonstrations) and of every question of 20 other generated
bases, whose names it must learn to copy rather than memorise. Then RL with the search agent
(examples/python/agent_search.py) on the train questions: reinforce_baseline, the reinforce_pro correction,
an fp32 engine. Evaluated on the held-out questions with greedy decoding at the warm start and after RL: with
search, and without (the service answers every search with an empty block; the same model, the same turns).
One JSON (machine, commit, configuration, per-seed numbers with each run's commit and host), then a table.

`--agent openai` trains with examples/python/agent_search_openai.py instead (the same agent written to the
OpenAI SDK, through the run's endpoint; its own JSON). The evaluation is the same in both: greedy episodes of the
AgentInstance file, which plays the SDK file's episodes id for id (tests/test_openai_agents.py), so the two
shapes' numbers measure the model each trained.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import reinforce_pro  # noqa: F401  (before ray: keeps a local cluster on loopback)
from benchmarks.common import run_provenance, scratch_dir
from studies.runner import study_main

NAME = "search_agent"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "python"
AGENT = EXAMPLES / "agent_search.py"  # the evaluation's agent, and the training's by default
TRAINING_AGENTS = {"instance": AGENT, "openai": EXAMPLES / "agent_search_openai.py"}
SETTINGS = {  # the agent's environment (examples/python/agent_search.py) and the run's shape
    "SEARCH_TOPK": "2", "SEARCH_INFO_CHARS": "110", "SEARCH_MAX_SEARCHES": "3",
    # extra_kbs: demonstrations from 20 other generated bases teach copying unseen names (docs/agents.md)
    "entities": 200, "demo_frac": 0.5, "extra_kbs": 20, "sft_steps": 1500,
    "max_turns": 4, "max_len": 512, "max_new_tokens": 40,
    "rollout_batch_size": 16, "n_samples_per_prompt": 8, "lr": 3e-4, "eval_questions": 200,
}  # fmt: skip


def prepare(seed: int, workdir: Path) -> tuple[dict, str, object]:
    """The knowledge base's files, the warm-started model and the BM25 index of one seed."""
    from reinforce_pro.search import knowledge
    from reinforce_pro.search.demonstrations import warm_start
    from reinforce_pro.search.retriever import BM25Index

    kb = knowledge.build(SETTINGS["entities"], seed=seed)
    paths = knowledge.write(kb, workdir / "kb")
    topk, chars = int(SETTINGS["SEARCH_TOPK"]), int(SETTINGS["SEARCH_INFO_CHARS"])
    stats = warm_start(
        workdir / "kb", workdir / "warm", SETTINGS["sft_steps"], SETTINGS["demo_frac"], topk, chars, seed,
        SETTINGS["extra_kbs"],
    )  # fmt: skip
    info = {**{k: str(v) for k, v in paths.items()}, **stats, "heldout_rows": kb.heldout}
    return info, str(workdir / "warm"), BM25Index(kb.passages)


def evaluate(engine, tokenizer, rows: list[dict], search: bool) -> dict:
    """Greedy episodes of the search agent on `rows`: accuracy, searches per episode, hit rate."""
    import ray

    from reinforce_pro.agents.contract import load_agent_class
    from reinforce_pro.agents.runner import AgentConfig, AgentRunner

    os.environ["SEARCH_OFF"] = "0" if search else "1"
    agent = load_agent_class(AGENT)  # reads its settings from the environment when loaded
    sample = lambda prompts, sampling: ray.get(engine.generate.remote(prompts, sampling))  # noqa: E731
    cfg = AgentConfig(max_turns=SETTINGS["max_turns"], max_len=SETTINGS["max_len"], prompt_max_len=64)
    runner = AgentRunner(agent, tokenizer, sample, {"temperature": 0.0, "max_tokens": SETTINGS["max_new_tokens"]}, cfg)
    episodes = runner.run_episodes([{"prompt": r["question"], "label": r["label"]} for r in rows], n=1)
    total = lambda key: [sum(e.extra_logs.get(key, [0.0])) for e in episodes]  # noqa: E731
    return {"accuracy": statistics.fmean(total("correct")), "searches": statistics.fmean(total("searches")),
            "hit": statistics.fmean(total("hit")), "invalid": statistics.fmean(total("invalid"))}  # fmt: skip


def run_seed(seed: int, steps: int, workdir: Path, agent: Path = AGENT) -> dict:
    import ray

    from reinforce_pro.cli.train_ppo_ray import parse
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine
    from reinforce_pro.run.driver import build_and_fit
    from reinforce_pro.run.prepare import prepare as prepare_run
    from reinforce_pro.search.retriever import make_server

    start, provenance = time.perf_counter(), run_provenance()
    info, warm, index = prepare(seed, workdir)
    server = make_server(index, port=0, max_concurrency=16)
    os.environ.update({k: v for k, v in SETTINGS.items() if k.startswith("SEARCH_")})
    os.environ["SEARCH_RETRIEVER_URL"] = server.start()
    engine = ray.remote(VLLMEngine).options(num_cpus=1).remote(
        EngineConfig(model_path=warm, dtype="float32", max_model_len=SETTINGS["max_len"], seed=seed)
    )  # fmt: skip
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(warm)
    rng_rows = info.pop("heldout_rows")[: SETTINGS["eval_questions"]]
    before = {"search": evaluate(engine, tok, rng_rows, True), "no_search": evaluate(engine, tok, rng_rows, False)}
    r, n = SETTINGS["rollout_batch_size"], SETTINGS["n_samples_per_prompt"]
    argv = ["--pretrain", warm, "--prompt_data", info["train"], "--input_key", "question", "--label_key", "label",
            "--agent_func_path", str(agent), "--agent_max_turns", str(SETTINGS["max_turns"]),
            "--advantage_estimator", "reinforce_baseline", "--enable_vllm_is_correction",
            "--vllm_is_correction_type", "reinforce_pro", "--n_samples_per_prompt", str(n),
            "--rollout_batch_size", str(r), "--train_batch_size", str(r * n), "--micro_train_batch_size", "32",
            "--micro_rollout_batch_size", "64", "--max_len", str(SETTINGS["max_len"]),
            "--max_new_tokens", str(SETTINGS["max_new_tokens"]), "--prompt_max_len", "64",
            "--actor_learning_rate", str(SETTINGS["lr"]), "--init_kl_coef", "0", "--vllm_dtype", "float32",
            "--param_dtype", "fp32", "--max_samples", str(r * steps), "--seed", str(seed),
            "--save_path", str(workdir / "rl"), "--actor_num_gpus_per_node", "1"]  # fmt: skip
    os.environ["SEARCH_OFF"] = "0"
    rl_start, history, after = time.perf_counter(), [], before  # --steps 0: the warm start alone
    if steps > 0:
        _, cfg = parse(argv)
        history = build_and_fit(cfg, prepare_run(cfg), engines=[engine])
        after = {"search": evaluate(engine, tok, rng_rows, True), "no_search": evaluate(engine, tok, rng_rows, False)}
    rl_wall = time.perf_counter() - rl_start
    ray.kill(engine)
    server.stop()
    curve = [h.get("rollout/reward_mean") for h in history]
    return {"seed": seed, "steps": len(history), "before": before, "after": after, "rl_wall_s": rl_wall,
            "wall_s": time.perf_counter() - start, "sft_loss_last": info["sft/loss_last"],
            "demonstrations": info["sft/demonstrations"], "reward_curve": curve,
            "searches_curve": [h.get("reward/searches") for h in history], **provenance}  # fmt: skip


def render(result: dict, out_dir: Path | None = None) -> str:
    """The table, seed by seed with the paired comparisons; written beside the JSON in `out_dir` when given."""
    runs = result["results"]["runs"]
    lines = ["| seed | held-out accuracy, search: warm start -> after RL | without search: warm start -> after | "
             "searches / episode (after) | hit rate (after) | RL steps | RL wall |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        b, a = r["before"], r["after"]
        lines.append(f"| {r['seed']} | {b['search']['accuracy']:.3f} -> {a['search']['accuracy']:.3f} | "
                     f"{b['no_search']['accuracy']:.3f} -> {a['no_search']['accuracy']:.3f} | "
                     f"{a['search']['searches']:.2f} | {a['search']['hit']:.2f} | {r['steps']} | "
                     f"{r['rl_wall_s'] / 60:.1f} min |")  # fmt: skip
    if len(runs) > 1:
        mean = lambda f: statistics.fmean(f(r) for r in runs)  # noqa: E731
        lines.append(f"| mean | {mean(lambda r: r['before']['search']['accuracy']):.3f} -> "
                     f"{mean(lambda r: r['after']['search']['accuracy']):.3f} | "
                     f"{mean(lambda r: r['before']['no_search']['accuracy']):.3f} -> "
                     f"{mean(lambda r: r['after']['no_search']['accuracy']):.3f} | | | | |")  # fmt: skip
        lines += ["", paired_line(runs)]
    if out_dir is not None:
        (out_dir / f"{result['benchmark']}.md").write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


def paired_line(runs: list[dict]) -> str:
    """The two comparisons the study is for, as paired differences over seeds with 95% bootstrap intervals."""
    from studies.study_stats import paired_bootstrap

    acc = lambda r, when, mode: r[when][mode]["accuracy"]  # noqa: E731
    rl = paired_bootstrap([acc(r, "after", "search") - acc(r, "before", "search") for r in runs])
    search = paired_bootstrap([acc(r, "after", "search") - acc(r, "after", "no_search") for r in runs])
    show = lambda m: f"{m[0]:+.3f} [{m[1]:+.3f}, {m[2]:+.3f}]"  # noqa: E731
    return (f"Held-out accuracy with search, after RL - warm start: {show(rl)}; after RL, with search - without: "
            f"{show(search)} (mean over {len(runs)} seeds, 95% paired bootstrap interval).")  # fmt: skip


def shape_key(agent: str) -> dict:
    """The config key of a training agent other than the AgentInstance file (whose JSON's config has none, so
    its resumed runs still match)."""
    return {"agent": agent} if agent != "instance" else {}


def study_name(steps: int, agent: str) -> str:
    """The JSON's name: the warm start alone and each training agent keep their own file."""
    name = NAME if steps > 0 else f"{NAME}_warm_start"
    return name + (f"_{agent}" if shape_key(agent) else "")


def run(args, study) -> None:
    from reinforce_pro.workers.launcher import start_ray

    start_ray(logical_cpus=8)
    config = {**SETTINGS, "steps": args.steps, **shape_key(args.agent)}
    runs = study.stored(config)  # the seeds an earlier invocation with these settings finished
    for seed in args.seeds:
        if any(r["seed"] == seed for r in runs):
            print(f"[search_agent] seed {seed}: already in {study.path}, kept", flush=True)
            continue
        print(f"[search_agent] seed {seed}", flush=True)
        with scratch_dir(f"search_{seed}_") as workdir:
            runs.append(run_seed(seed, args.steps, workdir, TRAINING_AGENTS[args.agent]))
        study.save(runs, config)


def main(argv=None) -> int:
    def options(p) -> None:
        p.add_argument("--agent", choices=list(TRAINING_AGENTS), default="instance",
                       help="the agent file RL trains with: the AgentInstance one, or the same agent written "
                            "to the OpenAI SDK (its own JSON); the evaluation is the same")  # fmt: skip

    name = lambda args: study_name(args.steps, args.agent)  # noqa: E731
    return study_main(argv, __doc__, name, run, render, options=options, seeds="1-3", steps=60,
                      steps_help="RL steps per seed (0: evaluate the warm start only)")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
