"""Does search self-play, with no question written by a person, teach the solver as much as RL on generated
questions? Three arms from one warm start per seed, held-out accuracy by hop count, paired over seeds.

    python -m studies.search_selfplay --seeds 1-5
    python -m studies.search_selfplay --render studies/results/search_selfplay.json

Seeds already in the output JSON with the same settings are kept, not rerun: an interrupted study resumes.

Per seed: a generated knowledge base (200 invented people; the 50 held-out people share no fact with the
train ones) and its BM25 service on loopback; the built-in tiny Qwen2 (512 positions) warm-started on the
search self-play task's demonstrations of both roles' formats, drawn from 20 *other* generated bases (so the
warm start teaches the formats, never this base's questions), stopped once its greedy search accuracy on 48
questions of one more base reaches SETTINGS["sft_target"] (checked every 50 steps): a fixed step count left
one seed at 0.21 and another at 0.99, with nothing to learn. From that one model:
  (c) warm start: evaluated as it is;
  (b) RL on the 600 generated train questions (the search agent's recipe: reinforce_baseline, one pass, 16
      questions x 8 episodes per step);
  (a) search self-play (--selfplay_task search): the same steps of 16 seed passages, the proposer writes 2
      questions per seed (1 re-proposal round), 8 episodes per question; solver reward = correctness alone, as
      in (b). Only the episodes of learnable questions are trained: equal steps, fewer episodes than (b);
  (d) RL on the generated questions at (a)'s trained solver episodes: (b)'s recipe for as many steps as (a)'s
      episodes fill (rounded), the comparison at matched solver samples.
Each arm is evaluated with greedy episodes on the 200 held-out questions (one and two hops). One JSON with each
run's commit, host and wall time, then a table of per-seed numbers and paired t-intervals (a-c, a-b, a-d, b-c).
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path

import reinforce_pro  # noqa: F401  (before ray: keeps a local cluster on loopback)
from benchmarks.common import run_provenance, scratch_dir
from studies.runner import study_main

NAME = "search_selfplay"
ARMS = ("warm", "rl", "rl_matched", "selfplay")
SETTINGS = {
    "entities": 200, "extra_kbs": 20, "sft_steps": 2000, "sft_target": 0.25, "steps": 37, "prompts_per_step": 16,
    "samples": 8, "questions_per_seed": 2, "repropose": 1, "max_turns": 4, "max_len": 512, "max_new_tokens": 40,
    "lr": 3e-4, "eval_questions": 200, "topk": 2, "info_chars": 110, "max_searches": 3,
}  # fmt: skip
COMMON = ["--advantage_estimator", "reinforce_baseline", "--enable_vllm_is_correction", "--vllm_is_correction_type",
          "reinforce_pro", "--init_kl_coef", "0", "--vllm_dtype", "float32", "--param_dtype", "fp32",
          "--micro_train_batch_size", "32", "--micro_rollout_batch_size", "64", "--prompt_max_len", "64",
          "--actor_num_gpus_per_node", "1"]  # fmt: skip


def warm_start(seed: int, workdir: Path) -> tuple[Path, Path, dict]:
    """The seed's knowledge base folder, and the tiny model warm-started on the search task's demonstrations."""
    from transformers import AutoTokenizer

    from reinforce_pro.models.tiny import build_tiny_model
    from reinforce_pro.search import knowledge
    from reinforce_pro.selfplay.search_task import SearchTask
    from reinforce_pro.trainer.sft_warmup import sft_on_sequences

    kb_dir = workdir / f"kb{seed}"
    knowledge.write(knowledge.build(SETTINGS["entities"], seed=seed), kb_dir)
    base = build_tiny_model(workdir / f"base{seed}", max_positions=SETTINGS["max_len"], seed=seed)
    task = SearchTask(kb_dir)  # the seeds as prepare's warm start of --selfplay_task search draws them
    sequences = task.warm_start_sequences(AutoTokenizer.from_pretrained(base), SETTINGS["extra_kbs"], seed=seed + 1)
    stop = task.warm_start_stop(SETTINGS["sft_target"], seed + 2)
    stats = sft_on_sequences(base, workdir / f"warm{seed}", sequences, steps=SETTINGS["sft_steps"], seed=seed,
                             stop=stop)  # fmt: skip
    return kb_dir, workdir / f"warm{seed}", {**stats, "sft/demonstrations": len(sequences), "sft/checks": stop.checks}


def evaluate(engine, tokenizer, rows: list[dict]) -> dict:
    """Greedy search episodes on held-out `rows`: accuracy overall and by hop count, searches per episode."""
    import ray

    from reinforce_pro.agents.runner import AgentConfig, AgentRunner
    from reinforce_pro.search.agent import search_agent
    from reinforce_pro.search.retriever import RetrieverClient

    agent = search_agent(RetrieverClient(os.environ["SEARCH_RETRIEVER_URL"]), SETTINGS["topk"],
                         SETTINGS["info_chars"], SETTINGS["max_searches"])  # fmt: skip
    sample = lambda prompts, sampling: ray.get(engine.generate.remote(prompts, sampling))  # noqa: E731
    cfg = AgentConfig(max_turns=SETTINGS["max_turns"], max_len=SETTINGS["max_len"], prompt_max_len=64)
    runner = AgentRunner(agent, tokenizer, sample, {"temperature": 0.0, "max_tokens": SETTINGS["max_new_tokens"]}, cfg)
    episodes = runner.run_episodes([{"prompt": r["question"], "label": r["label"]} for r in rows], n=1)
    correct = [sum(e.extra_logs.get("correct", [0.0])) for e in episodes]
    out = {"accuracy": statistics.fmean(correct),
           "searches": statistics.fmean(sum(e.extra_logs.get("searches", [0.0])) for e in episodes)}  # fmt: skip
    for hops in sorted({r["hops"] for r in rows}):
        out[f"hops{hops}"] = statistics.fmean(c for c, r in zip(correct, rows, strict=True) if r["hops"] == hops)
    return out


def arm_argv(arm: str, model: Path, kb_dir: Path, seed: int, out: Path, steps: int) -> list[str]:
    s = SETTINGS
    r, n = s["prompts_per_step"], s["samples"]
    shape = ["--pretrain", str(model), "--seed", str(seed), "--save_path", str(out), "--max_len", str(s["max_len"]),
             "--max_new_tokens", str(s["max_new_tokens"]), "--actor_learning_rate", str(s["lr"]),
             "--n_samples_per_prompt", str(n), "--rollout_batch_size", str(r),
             "--max_samples", str(r * steps)]  # fmt: skip
    if arm in ("rl", "rl_matched"):
        return [*COMMON, *shape, "--prompt_data", str(kb_dir / "train.jsonl"), "--input_key", "question",
                "--label_key", "label", "--agent_func_path", str(AGENT), "--agent_max_turns", str(s["max_turns"]),
                "--train_batch_size", str(r * n)]  # fmt: skip
    q = s["questions_per_seed"]
    return [*COMMON, *shape, "--absolute_zero", "--selfplay_task", "search", "--selfplay_kb", str(kb_dir),
            "--selfplay_retriever_url", os.environ["SEARCH_RETRIEVER_URL"], "--n_questions_per_prompt", str(q),
            "--max_repropose_attempts", str(s["repropose"]), "--proposer_train_scope", "group",
            "--task_completion_weight", "1.0", "--format_reward_coef", "0", "--proposer_reward_coef", "0",
            "--train_batch_size", str(r * (n + q))]  # fmt: skip


AGENT = Path(__file__).resolve().parent.parent / "examples" / "python" / "agent_search.py"


def trained_solver_episodes(arm: str, history: list[dict]) -> int:
    rows = [(h.get("rollout/num_samples", 0.0), h.get("reward/proposer_frac", 0.0)) for h in history]
    return round(sum(n * (1 - (frac if arm == "selfplay" else 0.0)) for n, frac in rows))


def matched_steps(selfplay_episodes: int) -> int:
    """RL steps whose solver episodes come nearest `selfplay_episodes` (at least one)."""
    return max(1, round(selfplay_episodes / (SETTINGS["prompts_per_step"] * SETTINGS["samples"])))


def run_seed(seed: int, workdir: Path, code: dict) -> dict:
    import ray

    from reinforce_pro.cli.train_ppo_ray import parse
    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine
    from reinforce_pro.run.driver import build_and_fit
    from reinforce_pro.run.prepare import prepare
    from reinforce_pro.search import knowledge
    from reinforce_pro.search.retriever import BM25Index, make_server

    start, provenance = time.perf_counter(), {**code, "started": run_provenance()["started"]}
    kb_dir, model, warm = warm_start(seed, workdir)
    base = knowledge.load(kb_dir)
    server = make_server(BM25Index(base.passages), port=0, max_concurrency=16)
    os.environ["SEARCH_RETRIEVER_URL"] = server.start()
    os.environ.update(
        SEARCH_TOPK=str(SETTINGS["topk"]),
        SEARCH_INFO_CHARS=str(SETTINGS["info_chars"]),
        SEARCH_MAX_SEARCHES=str(SETTINGS["max_searches"]),
    )  # the agent file's settings, as (a)'s
    engine = ray.remote(VLLMEngine).options(num_cpus=1).remote(
        EngineConfig(model_path=str(model), dtype="float32", max_model_len=SETTINGS["max_len"], seed=seed)
    )  # fmt: skip
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    heldout = base.heldout[: SETTINGS["eval_questions"]]
    record = {"seed": seed, **provenance, "warm_start": warm, "warm": {"heldout": evaluate(engine, tok, heldout)}}
    for arm in ("rl", "selfplay", "rl_matched"):  # each from the warm start, loaded into the shared engine
        arm_start = time.perf_counter()
        ray.get(engine.reseed.remote(seed))
        steps = matched_steps(record["selfplay"]["solver_episodes"]) if arm == "rl_matched" else SETTINGS["steps"]
        _, cfg = parse(arm_argv(arm, model, kb_dir, seed, workdir / f"{arm}{seed}", steps))
        history = build_and_fit(cfg, prepare(cfg), engines=[engine])
        record[arm] = {"heldout": evaluate(engine, tok, heldout), "steps": len(history),
                       "solver_episodes": trained_solver_episodes(arm, history),
                       "wall_s": time.perf_counter() - arm_start, "curves": curves(history)}  # fmt: skip
    ray.kill(engine)
    server.stop()
    return {**record, "wall_s": time.perf_counter() - start}


def curves(history: list[dict]) -> dict[str, list]:
    keys = ("rollout/reward_mean", "selfplay/search/valid_ratio", "unified_filter/learnable_ratio",
            "selfplay/search/proposed_hops_mean", "selfplay/search/proposed_subject_unique_frac",
            "selfplay/search/solver_correct_mean", "reward/searches")  # fmt: skip
    return {k: [h.get(k) for h in history] for k in keys if any(k in h for h in history)}


# ------------------------------------------------------------------------------------------ the table
def render(result: dict, out_dir: Path | None = None) -> str:
    """The table, seed by seed with the paired comparisons; written beside the JSON in `out_dir` when given."""
    runs = result["results"]["runs"]
    acc = lambda r, arm, key="accuracy": r[arm]["heldout"][key]  # noqa: E731
    lines = ["| seed | warm start (c) | RL, same steps (b) | RL, same episodes (d) | search self-play (a) | solver "
             "episodes trained (b / d / a) | warm-start steps (probe accuracy) | self-play valid / learnable ratio "
             "(mean) | host | commit |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        valid, learnable = (
            _mean(r["selfplay"]["curves"].get(k))
            for k in ("selfplay/search/valid_ratio", "unified_filter/learnable_ratio")
        )
        # "-": an arm the run's JSON does not hold (the pilot's ran before `rl_matched` existed)
        cells = [f"{acc(r, arm):.3f} ({acc(r, arm, 'hops1'):.2f} / {acc(r, arm, 'hops2'):.2f})" if arm in r else "-"
                 for arm in ARMS]  # fmt: skip
        episodes = " / ".join(str(r[arm]["solver_episodes"]) if arm in r else "-"
                              for arm in ("rl", "rl_matched", "selfplay"))  # fmt: skip
        warm = r["warm_start"]
        lines.append(f"| {r['seed']} | {' | '.join(cells)} | {episodes} | {warm['sft/steps']} "
                     f"({warm.get('sft/stop_accuracy', math.nan):.2f}) | {valid:.2f} / {learnable:.2f} | "
                     f"{r['host_id']} | {r['commit'][:7]}{'' if r['clean'] else '-dirty'} |")  # fmt: skip
    lines.append("\nHeld-out accuracy with search, greedy: all questions (one hop / two hops).")
    if len(runs) >= 2:
        from studies.study_stats import holm, paired_test

        pairs = (
            ("selfplay", "warm", "self-play - warm start"),
            ("selfplay", "rl", "self-play - RL, same steps"),
            ("selfplay", "rl_matched", "self-play - RL, same episodes"),
            ("rl", "warm", "RL - warm start"),
        )
        pairs = tuple(pair for pair in pairs if all(pair[0] in r and pair[1] in r for r in runs))
        tests = [paired_test([acc(r, a) - acc(r, b) for r in runs]) for a, b, _ in pairs]
        for (_, _, label), t, p_holm in zip(pairs, tests, holm([t.p_t for t in tests]), strict=True):
            lines.append(f"- {label}: {t.mean:+.3f}, 95% t-interval [{t.low:+.3f}, {t.high:+.3f}] (paired over "
                         f"{t.n} seeds; t-test p = {_p(t.p_t)}, Holm over these {len(pairs)}: "
                         f"{_p(p_holm)})")  # fmt: skip
    if out_dir is not None:
        (out_dir / f"{result['benchmark']}.md").write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


def _p(value: float | None) -> str:
    return "- (no spread)" if value is None else f"{value:.3f}"


def _mean(values: list | None) -> float:
    values = [v for v in values or [] if v is not None]
    return statistics.fmean(values) if values else math.nan


def run(args, study) -> None:
    runs = study.stored(SETTINGS)
    from reinforce_pro.workers.launcher import start_ray

    start_ray(logical_cpus=8)
    with scratch_dir("search_selfplay_") as workdir:
        for seed in [s for s in args.seeds if s not in {r["seed"] for r in runs}]:
            print(f"[search_selfplay] seed {seed}", flush=True)
            runs.append(run_seed(seed, workdir, study.code))
            study.save(runs, SETTINGS)  # after each seed: a stop loses no seed


def main(argv: list[str] | None = None) -> int:
    return study_main(argv, __doc__, NAME, run, render, seeds="1-5", clean=True)


if __name__ == "__main__":
    sys.exit(main())
