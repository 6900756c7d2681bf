"""One run, top to bottom: from a RunConfig to a trained model, its metrics and its summary.

    cli/train_ppo_ray.main   flags -> RunConfig (cli/flags_to_config.py)
    train(cfg)               prepare (run/prepare.py) -> RunPlan -> build_and_fit -> summarise; errors -> exit 2
    build_and_fit(cfg, plan) Ray -> actor groups (run/actors.py) -> experience builder, rollout source ->
                             PPOTrainer.fit (trainer/ppo_trainer.py) -> the final model saved; an actor lost
                             on the way (run/faults.py): the actors again, from the newest checkpoint

The benchmarks and end-to-end tests call build_and_fit directly, with engines they share between runs.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
from pathlib import Path

import ray
from ray import exceptions as rex

from reinforce_pro.agents.contract import AgentFileError
from reinforce_pro.algos.kl import build_kl_controller
from reinforce_pro.models.lora import trainable_summary
from reinforce_pro.rewards.loader import RewardFileError
from reinforce_pro.rollout.sampler import Sampler
from reinforce_pro.rollout.teacher_engines import EngineTeacher
from reinforce_pro.run import actors, faults, resume, run_lock, sources, start
from reinforce_pro.run.config import RunConfig, RunPlan
from reinforce_pro.run.errors import UserInputError
from reinforce_pro.run.memory import MemoryWatch
from reinforce_pro.search.retriever import RetrieverError
from reinforce_pro.serving import ServiceLost
from reinforce_pro.trainer.drift_plot import draw_drift
from reinforce_pro.trainer.experience_builder import ExperienceBuilder
from reinforce_pro.trainer.logger import MetricsLogger
from reinforce_pro.trainer.ppo_trainer import PPOTrainer
from reinforce_pro.workers.launcher import PlacementFailed, gpus_available, start_ray


def train(cfg: RunConfig) -> int:
    """The command line's run: 0 when it finished, 2 with one line on stderr for a user's mistake (a bad
    input found before Ray starts, a reward function or an agent whose every episode fails mid-run, a flag this
    machine cannot honour)."""
    from reinforce_pro.run.prepare import prepare

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        command = resume.asked(cfg)
        cfg, from_first_step = resume.rerun(cfg, command)  # the same command again resumes its run
        plan = prepare(cfg)
        if from_first_step:  # its rows cut only now that the inputs are checked
            resume.cut_rows(plan.run_dir, -1)
        resume.record_command(command, plan.run_dir, cfg.loop.checkpoints.run_id if cfg.loop.checkpoints else None)
        history = build_and_fit(cfg, plan)
    except RewardFileError as e:  # the user's reward function failed: the steps before it are in metrics.jsonl
        url = cfg.models.remote_rm_url
        print(f"train_ppo_ray: error: {f'--remote_rm_url {url}: ' if url else ''}{e}", file=sys.stderr)
        return 2
    except AgentFileError as e:  # every episode of a step failed (the message names the file and the step)
        print(f"train_ppo_ray: error: {e}", file=sys.stderr)
        return 2
    except UserInputError as e:
        print(f"train_ppo_ray: error: {e}", file=sys.stderr)
        return 2
    except (faults.RunLost, ServiceLost, RetrieverError) as e:  # an actor lost past --max_failures, a service
        print(f"train_ppo_ray: error: {e}", file=sys.stderr)  # that cannot restart or is not the run's to restart
        return 1
    except OSError as e:
        if e.errno not in FULL:
            raise
        where = e.filename or "the run's files"
        print(f"train_ppo_ray: error: {e.strerror} writing {where}: free space (or give --save_path / --ckpt_path "
              "elsewhere) and run the same command again to resume", file=sys.stderr)  # fmt: skip
        return 1
    finally:
        run_lock.release_all()  # the run directory is another start's to take (an exit would drop it too)
    return summarise(history, plan)


FULL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # a disk full, a quota spent, a file system gone read-only


def build_and_fit(cfg: RunConfig, plan: RunPlan, engines=None) -> list[dict]:
    """Start (or join) Ray, create the groups, run fit(), save the final model. `engines` lets callers
    (benchmarks, end-to-end tests) share already-started rollout engines. An actor lost mid-run (run/faults.py)
    costs the steps since the newest checkpoint: the run's actors start again from it, up to --max_failures
    times (never with the caller's engines); past that the run stops with faults.RunLost."""
    from transformers import AutoTokenizer

    start_ray(actors.logical_cpus(cfg), quiet=not cfg.output.verbose)
    use_gpu = gpus_available()
    start.check_sleep_flags(cfg, use_gpu)
    cfg = resume.run_checkpoints(start.start_config(cfg, plan, use_gpu), plan.run_dir)
    if engines is None and (line := resume.checkpoint_line(cfg, plan, sys.argv[1:])):
        print(line, flush=True)
    (plan.run_dir / "config.json").write_text(json.dumps(cfg.as_dict(), indent=2, default=str) + "\n")
    if plan.log_dir is not None:
        print(f"[logs] engine and worker output: {plan.log_dir}/ (--verbose: on the console)", flush=True)
    if engines is None:
        start.announce_engines(cfg, use_gpu)
    tokenizer = AutoTokenizer.from_pretrained(plan.model_path, use_fast=not cfg.models.disable_fast_tokenizer)
    budget = faults.FailureBudget(cfg.loop.max_failures)  # whole-run restarts and engine restarts alike
    while True:
        try:
            fit_once(cfg, plan, use_gpu, engines, tokenizer, budget)
            return logged_history(plan.run_dir)  # every step, across resumes and restarts
        except PlacementFailed as e:  # the cluster cannot hold the run's groups (after a node was lost, say)
            saved = resume.latest(cfg)
            note = lost_run_note(plan, saved, "its actors cannot be placed") if saved else ""
            raise faults.RunLost(f"{e}{note}") from None
        except ActorLost as lost:
            saved = resume.latest(cfg)
            if engines is not None or not budget.spend():
                why = stop_reason(engines is not None, budget)
                raise faults.RunLost(f"{lost}{lost_run_note(plan, saved, why)}") from lost.__cause__
            print(f"[recover] {lost}; starting the run's actors again from {saved or 'the first step'} "
                  f"({budget.used} of --max_failures {budget.limit})", flush=True)  # fmt: skip
            cfg = resume.resuming(cfg, plan.run_dir, saved)


class ActorLost(Exception):
    """fit_once's report of a lost actor, named while the run's actors were still known (faults.describe)."""


def fit_once(cfg: RunConfig, plan: RunPlan, use_gpu: bool, engines, tokenizer, budget) -> list[dict]:
    """The actor groups, the experience builder, the rollout source and the trainer (resumed under
    --load_checkpoint), fit(), the final model saved; the actors released whatever happens. An engine lost
    mid-fit is started again in place while `budget` (faults.FailureBudget) allows (engine_restarter)."""
    groups = actors.build_groups(cfg, plan, use_gpu, engines)
    logger, source, trainer = None, None, None
    try:
        if cfg.models.lora:  # the policy's own line goes to its log file: say it here too
            summary = ray.get(groups.policy[0].__ray_call__.remote(lambda w: trainable_summary(w.engine.module)))
            print(f"[lora] rank {cfg.models.lora.rank}, alpha {cfg.models.lora.alpha}: {summary}", flush=True)
        kl_ctl = build_kl_controller(cfg.kl.init_coef, cfg.kl.target, cfg.kl.horizon)
        # self-play tasks and AgentInstance environments score their own rollouts: no reward function (an
        # OpenAI-SDK agent may leave the scoring to it, as OpenRLHF's executor does)
        scored = plan.task or plan.reward_source.startswith("agent:")
        reward_fn = None if scored else sources.reward_function(cfg, plan, use_gpu, groups)
        teacher = groups.teacher
        if cfg.distill and cfg.distill.teacher_backend == "engine":
            teacher = EngineTeacher(groups.teacher)
        builder = ExperienceBuilder(groups.policy, groups.reference, groups.critic, reward_fn, cfg.experience, kl_ctl,
                                    teacher, cfg.distill)  # fmt: skip
        sampler = Sampler(groups.engines, tokenizer, cfg.rollout)
        source = sources.rollout_source(cfg, plan, groups, sampler, use_gpu)
        resume_from = resume.resume_checkpoint(cfg, plan)  # before the logger opens the jsonl files it truncates
        memory = MemoryWatch(actors.record_placement(groups, plan.run_dir))
        print(memory.startup_line(), flush=True)
        logger = MetricsLogger(plan.run_dir, cfg.output.tensorboard, wandb_cfg=cfg.output.wandb)
        trainer = PPOTrainer(
            source, builder, groups.policy, groups.critic, groups.engines, plan.prompts, logger, cfg.loop,
            sources.eval_set(cfg, plan, tokenizer, source),
            engines_hold_start_weights=groups.owned_engines and start.engines_load_policy_weights(cfg),
            extra_metrics=memory.metrics, restart_engine=engine_restarter(groups, plan, budget, memory),
        )  # fmt: skip
        if resume_from is not None:
            try:
                trainer.restore(resume_from)
            except ValueError as e:  # another prompt count or seed than the checkpoint's (PromptLoader)
                raise UserInputError(f"{resume_from}: {e}") from None
            print(f"[resume] from {resume_from} at step {trainer.step}", flush=True)
        trainer.fit()
        history = logged_history(plan.run_dir)  # a resumed run's fit() holds only the steps since its checkpoint
        write_drift_picture(history, plan.run_dir, logger)
        ray.get([p.save_hf.remote(str(plan.run_dir / "final_model")) for p in groups.policy])
        if cfg.models.lora_save_merged:
            ray.get([p.save_hf.remote(str(plan.run_dir / "final_model_merged"), True) for p in groups.policy])
        if cfg.models.save_value_network and groups.critic:
            ray.get([c.save.remote(str(plan.run_dir / "final_critic")) for c in groups.critic])
        return history
    except (*faults.LOST, rex.RayTaskError) as e:  # a lost actor, or an actor's error a dead peer may have caused
        raise actor_lost(e, groups.roles(), trainer.step if trainer else 0) from e
    finally:
        if logger is not None:
            logger.close()
        if plan.task is not None:
            getattr(plan.task, "close", lambda: None)()  # a service the task started (search self-play)
        getattr(source, "close", lambda: None)()  # the endpoint an OpenAI-SDK agent's episodes call
        groups.release()


def actor_lost(error: BaseException, roles: dict[str, list], step: int) -> ActorLost:
    """fit_once's report of `error`: a lost actor named, or an actor's own error (RayTaskError) that a dead actor
    of the run caused (the survivors of a collective whose peer died: "connection closed by peer") reported as
    that actor's loss with the survivor's error as a note; with every actor alive, `error` itself is raised."""
    if isinstance(error, faults.LOST):
        return ActorLost(faults.describe(error, roles, step))
    dead = faults.dead_actor(roles)
    if dead is None:
        raise error
    return ActorLost(f"{faults.describe(dead, roles, step)} (another rank's call failed with it: "
                     f"{faults.first_line(error)})")  # fmt: skip


def engine_restarter(groups: actors.RunActors, plan: RunPlan, budget, memory: MemoryWatch):
    """PPOTrainer's restart_engine (trainer/engine_recovery.py): engine `index` lost (dead, or hung) is killed
    and started again in its place, one of the run's --max_failures spent, in one [recover] line; the error is
    raised again once the budget is spent. None for engines the caller passed in (they are not the run's)."""
    if groups.new_engine is None:
        return None

    def restart(index: int, error: BaseException, step: int):
        if not budget.spend():
            raise error
        print(f"[recover] {faults.describe(error, groups.roles(), step)}; a new vLLM engine {index} takes the weights "
              f"the others hold and the call runs again ({budget.used} of --max_failures {budget.limit})",
              flush=True)  # fmt: skip
        ray.kill(groups.engines[index])  # a hung engine's process too: Ray ends it
        groups.engines[index] = groups.new_engine(index)
        memory.follow(actors.record_placement(groups, plan.run_dir))
        return groups.engines[index]

    return restart


def stop_reason(callers_engines: bool, budget) -> str:
    """Why a run with a lost actor stops instead of recovering."""
    if callers_engines:
        return "the run's engines are its caller's"
    return f"{budget.used + 1} actors lost, past --max_failures {budget.limit}"


def lost_run_note(plan: RunPlan, saved: Path | None, why: str) -> str:
    """What a run that stops for a lost actor says after naming it: `why` it stopped, what is saved, and the
    command that resumes."""
    if saved is None:
        return f" ({why}); no checkpoint was saved (--save_steps N or --auto_checkpoint_minutes keeps one)"
    return f" ({why}); saved: {saved}; resume with: {resume.resume_command(sys.argv[1:], saved.parent, plan.run_dir)}"


def logged_history(run_dir: Path) -> list[dict]:
    """Every trained step as metrics.jsonl holds it (a run that recovered from a lost actor has the steps before
    the checkpoint it resumed from there, not in its last fit()'s history)."""
    rows, path = [], run_dir / "metrics.jsonl"
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line cut by a kill, or mangled: not a row
            continue
    return [{k: (math.nan if v is None else v) for k, v in r.items()} for r in rows if r.get("step", 0) > 0]


def write_drift_picture(history: list[dict], run_dir: Path, logger: MetricsLogger) -> None:
    """drift.png in the run directory and TensorBoard: the engine-trainer gap by response position over the
    steps (trainer/drift_plot.py; any run's metrics.jsonl renders it again)."""
    fig = draw_drift(history, title=run_dir.name)
    if fig is None:
        return
    import matplotlib.pyplot as plt

    fig.savefig(run_dir / "drift.png", dpi=110)
    logger.add_figure("rollout/drift", fig, int(history[-1]["step"]))
    plt.close(fig)
    print(f"[drift] {run_dir / 'drift.png'}: the engine-trainer gap by response position over the steps", flush=True)


def summarise(history: list[dict], plan: RunPlan) -> int:
    """summary.json in the run directory (first and last rewards, wall time, self-play halves) and the closing
    lines on the console."""
    rewards = [h["rollout/reward_mean"] for h in history]
    if not rewards:
        print(f"\n[done] no steps left to run. Run directory: {plan.run_dir}", flush=True)
        return 0
    k = min(5, len(rewards))
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    summary = {
        **plan.summary,
        "steps": len(rewards),
        "reward_first5": first,
        "reward_last5": last,
        "reward_gain": last - first,
        "wall_s": sum(h["time/step"] for h in history),
        "final_model": str(plan.run_dir / "final_model"),
        **_selfplay_halves(history),
    }
    (plan.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for key in ("unified_filter/learnable_ratio", "repropose/total_attempts"):
        if f"{key}:first_half" in summary:
            print(f"[self-play] {key}: first half {summary[f'{key}:first_half']:.3f}, "
                  f"second half {summary[f'{key}:second_half']:.3f}", flush=True)  # fmt: skip
    print(
        f"\n[done] {len(rewards)} steps; mean reward of the first {k} steps {first:.3f}, of the last {k} "
        f"{last:.3f} (gain {last - first:+.3f}). Run directory: {plan.run_dir}",
        file=sys.stdout,
        flush=True,
    )
    return 0


def _selfplay_halves(history: list[dict]) -> dict:
    """Means of the self-play curves over the first and second half of the run (the demo's yardstick)."""
    out = {}
    half = len(history) // 2
    for key in ("unified_filter/learnable_ratio", "repropose/total_attempts", "proposer/reward_mean"):
        if half and key in history[0]:
            values = [h[key] for h in history]
            out[f"{key}:first_half"] = sum(values[:half]) / half
            out[f"{key}:second_half"] = sum(values[half:]) / (len(values) - half)
    return out
