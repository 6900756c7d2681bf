"""The RL loop: generate -> make_experience -> train -> weight_sync, one named, timed phase each.

A rollout source (rollout/sampler.py: plain prompts, self-play, agents) turns prompt records into Samples;
the ExperienceBuilder (trainer/experience_builder.py) turns Samples into Experience; the loop composes the two.

With --async_train the generate phase runs in a producer thread, up to --async_queue_size policy versions
ahead of the trainer (trainer/rollout_stream.py); the rest of the loop is the same code."""

from __future__ import annotations

import json
import math
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import ray
import torch
from tqdm import tqdm

from reinforce_pro.agents.contract import AgentFileError
from reinforce_pro.algos.stats import Stat, reduce_stats
from reinforce_pro.experience import Experience, budget_chunks, split_by_tokens, split_experience
from reinforce_pro.flagspec import flag
from reinforce_pro.rewards.loader import RewardFileError
from reinforce_pro.rollout.sampler import PartialRollout, RolloutSource
from reinforce_pro.serving import service_restarts
from reinforce_pro.trainer import best_model
from reinforce_pro.trainer.checkpoint import CheckpointClash, load_state, rotate, save_checkpoint
from reinforce_pro.trainer.dynamic_filter import generate_filtered
from reinforce_pro.trainer.engine_recovery import EngineRecovery, Restart
from reinforce_pro.trainer.evaluation import evaluate, evaluate_agent
from reinforce_pro.trainer.experience_builder import ExperienceBuilder, agreement_line
from reinforce_pro.trainer.logger import MetricsLogger
from reinforce_pro.trainer.prompt_loader import PromptLoader
from reinforce_pro.trainer.rollout_stream import (
    LAG_METRICS,
    AdaptiveLag,
    AsyncRollouts,
    EngineGate,
    RolloutBatch,
    SyncRollouts,
)
from reinforce_pro.trainer.weight_sync import make_weight_sync
from reinforce_pro.workers.group import ActorGroup


@dataclass
class CheckpointConfig:
    ckpt_path: Path | None  # None: <run dir>/checkpoints (the default checkpoints; run/driver.py fills it in)
    save_steps: int
    # fmt: off
    max_ckpt_num: int = flag(3, "keep the newest N checkpoints", dotted="ckpt.max_num", at_least=1, group="running")
    max_ckpt_mem: float = flag(float("inf"), "delete the oldest checkpoints beyond this many GB", dotted="ckpt.max_mem",
        above=0, group="running")
    save_hf_ckpt: bool = flag(False, "also save the policy as an HF model in each checkpoint", dotted="ckpt.save_hf",
        group="running")
    disable_ds_ckpt: bool = flag(False, "skip DeepSpeed states in checkpoints (then no resume from them)",
        dotted="ckpt.disable_ds", group="running")
    # fmt: on
    resume: bool = False  # --load_checkpoint: start from the latest complete checkpoint in ckpt_path
    every_s: float = 300.0  # --auto_checkpoint_minutes x 60 without --save_steps (else 0): save by the clock too
    # the run's id (run/resume.py: new for a new run, kept by a resumed one), written into each checkpoint so that a
    # resume, a recovery and rotation take only this run's (a shared --ckpt_path holds others' too); None: any
    run_id: str | None = None


@dataclass
class LoopConfig:
    # fmt: off
    num_episodes: int = flag(1, "passes over the prompt data", dotted="train.num_episodes", at_least=1,
        group="training")
    rollout_batch_size: int = flag(1024, "prompts per step", dotted="rollout.batch_size", at_least=1, group="training")
    n_samples_per_prompt: int = flag(1,
        "responses per prompt (the group size; self-play: solver responses per question)",
        dotted="rollout.n_samples_per_prompt", at_least=1, group="training")
    train_batch_size: int = 128  # samples per optimizer step, over all data-parallel ranks
    micro_train_batch_size: int = 4  # samples per forward on one rank
    # --use_dynamic_batch: micro-batches cut by this many tokens instead of a count: padded (rows x longest row),
    # or real ones with packing_samples
    train_max_tokens: int | None = None
    packing_samples: bool = False  # the budget then counts real tokens: packed micro-batches hold no padding
    max_epochs: int = flag(1, "training passes over each rollout batch", dotted="train.max_epochs", at_least=1,
        group="training")
    freezing_actor_steps: int = flag(-1, "train only the critic for N steps", dotted="critic.freezing_steps",
        group="training")
    logging_steps: int = flag(1, "log metrics (TensorBoard, wandb) every N steps (jsonl: every step)",
        dotted="logger.logging_steps", at_least=1, group="running")
    seed: int = 42
    sync_dtype: str = "float32"  # the engines' dtype: weights are sent in it
    engine_quantization: str | None = None  # the engines' online quantization (--vllm_quantization)
    trainer_dtype: str = "fp32"  # the policy's parameter dtype (--param_dtype)
    sync_backend: str = "object_store"  # object_store | gloo | nccl (trainer/weight_sync.py)
    sync_bucket_mb: float = 256.0  # gloo | nccl: bytes per broadcast
    engine_tp_size: int = 1  # workers per engine (each joins the broadcast group)
    rollout_staleness: int = flag(0,
        "[reinforce_pro] engines sample with the policy of K steps ago (K weight versions are kept in the object "
        "store): the off-policy lag of asynchronous RL, reproduced for studying IS correction; evaluations measure the "
        "newest policy", at_least=0, group="engines")
    dynamic_filtering_reward_range: tuple[float, float] | None = None  # None: no dynamic filtering
    eval_steps: int = flag(-1,
        "evaluate on --eval_dataset (self-play: the task's held-out ladder) every N steps (-1: never)",
        dotted="eval.steps", group="running")
    eval_before_training: bool = flag(False, "[reinforce_pro] evaluate once before the first step", group="running")
    samples_log_steps: int = flag(0,
        "[reinforce_pro] write a prompt / response / reward table (samples.jsonl, wandb) every N steps (0: never)",
        group="running")
    # else skipped where the training forward gives the same numbers (old_log_probs_needed)
    recompute_old_log_probs: bool = flag(False,
        "[reinforce_pro] always compute the old log-probs in a forward pass before training. By default that pass is "
        "skipped when a step trains the policy once on one mini-batch (--max_epochs 1, samples per step <= "
        "--train_batch_size, no KL penalty in the reward): the training forward's own log-probs, detached, are then "
        "the same numbers", group="training")
    # the producer thread: trainer/rollout_stream.py
    async_train: bool = flag(False,
        "generate the next rollout batches in a producer thread while the policy trains on this one; rollouts are "
        "then up to --async_queue_size policy versions stale (logged as async/staleness_*)",
        dotted="train.async_enable", group="engines")
    async_queue_size: int = flag(1,
        "with --async_train: how many batches (= policy versions) the producer may run ahead of the trainer; the "
        "bound on a trained sample's staleness (>= 1)", dotted="train.async_queue_size", at_least=1, group="engines")
    # with async_train: move the lag within [0, async_queue_size] to keep this metric under the target
    async_lag_target: float | None = flag(None,
        "[reinforce_pro] with --async_train: adaptive staleness. After each step the producer's lead moves within [0,"
        " --async_queue_size]: one version less while --async_lag_metric is above this target, one more while it is "
        "below half of it (logged as async/max_lag)", group="engines")
    async_lag_metric: str = flag(LAG_METRICS[0],
        "[reinforce_pro] the mismatch --async_lag_target holds: the IS correction's masked token fraction (needs "
        "--enable_vllm_is_correction) or the mean |trainer - engine log-prob|", choices=LAG_METRICS, group="engines")
    # with async_train: sample in chunks of this many tokens, letting weight syncs in between (rollout_stream.py)
    partial_rollout_chunk: int | None = None
    best_metric_key: str | None = None  # keep the policy with the highest value of this eval metric...
    best_model_dir: Path | None = None  # ...here (HF format)
    checkpoints: CheckpointConfig | None = None  # None: no checkpoints
    # counted by run/driver.py, which restarts the actors
    max_failures: int = flag(3,
        "[reinforce_pro] lost actors (killed by a signal or Ray's memory monitor, crashed) the run recovers from by "
        "restarting its actors from the newest checkpoint; past them it stops with one line (0: at the first)",
        at_least=0, group="running")
    # fmt: on
    engine_timeout_s: float = 1800.0  # a weight sync an engine has not taken by then: hung (rollout/engine_wait.py)


@dataclass
class EvalSet:
    """--eval_dataset: k samples (or agent episodes) per prompt, scored by the run's reward function (or the
    agent's environment). Self-play runs use their task's held-out ladder instead (selfplay/ladder.py), with the
    same `name` and `run`."""

    name: str
    prompts: list[dict]  # [{"prompt", "label"}]
    n_samples: int
    temperature: float
    source: object | None = None  # --agent_func_path: the run's agent source, whose episodes are evaluated

    def run(self, sampler, score) -> dict[str, float]:
        if self.source is not None:
            return evaluate_agent(self.source, score, self.prompts, self.name, self.n_samples, self.temperature)
        return evaluate(sampler, score, self.prompts, self.name, self.n_samples, self.temperature)


@contextmanager
def timed(timings: dict[str, float], phase: str):
    start = time.perf_counter()
    yield
    timings[f"time/{phase}"] = time.perf_counter() - start


class PPOTrainer:
    def __init__(
        self, source: RolloutSource, builder: ExperienceBuilder, policy, critic, engines, prompts,
        logger: MetricsLogger, cfg: LoopConfig, eval_set: EvalSet | None = None, engines_hold_start_weights=False,
        extra_metrics=dict, restart_engine: Restart | None = None,
    ):  # fmt: skip
        """source: a RolloutSource (rollout/sampler.py: PromptSource, SelfPlaySource, AgentSource).
        engines_hold_start_weights: the engines were started by this run from the policy's own starting weights,
        so the weight sync before the first step has nothing to send (a few seconds of a real model's start).
        extra_metrics: called every step, its metrics added to the step's (the driver's memory/*).
        restart_engine: starts a lost engine again in place (trainer/engine_recovery.py); None: a lost engine
        ends fit()."""
        self.source, self.builder = source, builder
        self.policy, self.critic, self.engines = policy, critic, engines
        self.logger, self.cfg, self.eval_set = logger, cfg, eval_set
        self.loader = PromptLoader(prompts, cfg.rollout_batch_size, cfg.num_episodes, cfg.seed)
        self.step = 0  # completed steps (restored by resume) = the policy's weight version
        self.best: dict | None = None  # --best_metric_key: {"step", "key", "value"} of the saved best policy
        self.history: list[dict[str, float]] = []
        self.weight_sync = make_weight_sync(
            cfg.sync_backend, policy, engines, cfg.sync_dtype, cfg.rollout_staleness, cfg.sync_bucket_mb,
            cfg.engine_tp_size, self.synchronous_partial, cfg.engine_timeout_s,
        )  # fmt: skip
        self.gate = EngineGate()  # the engines' weight version; keeps generation and weight syncs apart
        # a broadcast gives a new engine the policy's current weights: under --async_train the policy has moved on
        in_place = restart_engine if not cfg.async_train or cfg.sync_backend == "object_store" else None
        self.recovery = EngineRecovery(engines, self.weight_sync, in_place)
        self.lag_ctl = None
        if cfg.async_train and cfg.async_lag_target is not None:
            self.lag_ctl = AdaptiveLag(cfg.async_queue_size, cfg.async_lag_target, cfg.async_lag_metric)
        self.trained_source = self.source_state()  # the resume point: after the last trained batch
        self.engines_hold_start_weights = engines_hold_start_weights
        self.last_saved = time.monotonic()  # --auto_checkpoint_minutes counts from here
        self.extra_metrics = extra_metrics  # what the driver adds to every step's metrics (run/memory.py: memory/*)
        if cfg.partial_rollout_chunk is not None:
            settled = 1 if self.synchronous_partial else None  # synchronously only the first chunk differs
            self.source.use_partial(PartialRollout(cfg.partial_rollout_chunk, self.chunk_weights, settled))

    @property
    def synchronous_partial(self) -> bool:
        """--partial_rollout with --rollout_staleness (no --async_train): each response's first chunk is sampled by
        the weights one version older than the rest, set rather than left to timing (chunk_weights)."""
        return self.cfg.partial_rollout_chunk is not None and not self.cfg.async_train

    def chunk_weights(self, chunk: int) -> int:
        """The weight version that samples a partial rollout's next chunk (chunk 0: a call's first). Under
        --async_train whatever the engines hold once a waiting sync has gone in (self.gate is replaced on
        resume, so it is looked up at each call); synchronously (--rollout_staleness K) the weights K + 1
        versions back for the first chunk and K back for the rest (ObjectStoreSync.hold_for_chunk)."""
        if not self.synchronous_partial:
            return self.gate.let_syncs_in()
        self.gate.version = self.weight_sync.hold_for_chunk(chunk)
        return self.gate.version

    def fit(self) -> list[dict[str, float]]:
        fresh_engines = self.cfg.rollout_staleness == 0 and not self.synchronous_partial
        if not (self.engines_hold_start_weights and self.step == 0 and fresh_engines):
            self.sync_weights(self.step)  # shared engines, a resumed policy, or --rollout_staleness's version 0
        if self.eval_set and self.cfg.eval_before_training and self.step == 0:
            metrics = self.evaluate()
            self.logger.log(0, metrics)
            self.keep_best(0, metrics)
        bar = tqdm(total=self.loader.steps(), initial=self.step, desc="RL steps", dynamic_ncols=True)
        with self.rollout_stream() as stream:
            while True:
                step, timings, start = self.step + 1, {}, time.perf_counter()
                batch, waited = stream.get()  # synchronous: generates it now
                if batch is None:
                    break  # the prompt stream ran out (possibly while topping up a filtered batch)
                self.logger.write("consumed", {"step": step, "prompts": batch.consumed})
                samples, metrics, busy_from = batch.samples, dict(batch.metrics), time.perf_counter()
                with timed(timings, "make_experience"):
                    experience, exp_metrics = self.builder.make_experience(samples, self.old_log_probs_needed(samples))
                with timed(timings, "train"):
                    metrics.update(exp_metrics)
                    metrics.update(self.train(experience, step))
                self.adapt_lag(stream, metrics)  # before the sync: the producer rechecks its bound when it lands
                with timed(timings, "weight_sync"):
                    self.sync_weights(step)
                if self.eval_set and self.cfg.eval_steps > 0 and step % self.cfg.eval_steps == 0:
                    with timed(timings, "eval"):
                        evaluation = self.evaluate()
                        metrics.update(evaluation)
                        self.keep_best(step, evaluation)
                timings["time/step"] = time.perf_counter() - start
                timings["time/generate"] = batch.generate_s
                metrics.update(timings)
                metrics.update(self.rollout_metrics(batch, stream, waited, busy_from, timings["time/step"]))
                metrics["perf/tokens_per_s"] = float(samples.action_mask.sum()) / timings["time/step"]
                metrics.update(self.extra_metrics())
                metrics["faults/engine_restarts"] = float(self.recovery.restarts)
                metrics["faults/service_restarts"] = float(service_restarts())
                self.step, self.trained_source = step, batch.source_state
                self.record(step, metrics, samples, experience.rewards)
                self.export_sidecars(step, experience)
                self.maybe_save(step)
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['rollout/reward_mean']:.3f}", step_s=f"{timings['time/step']:.1f}")
        bar.close()
        return self.history

    def rollout_stream(self) -> SyncRollouts | AsyncRollouts:
        if not self.cfg.async_train:
            return SyncRollouts(self.produce, self.step + 1)
        lag = self.cfg.async_queue_size if self.lag_ctl is None else self.lag_ctl.lag
        return AsyncRollouts(self.produce, self.step + 1, self.gate, lag)

    def adapt_lag(self, stream, metrics: dict[str, float]) -> None:
        """--async_lag_target: set the producer's lag from this step's mismatch; logged as async/max_lag."""
        if self.lag_ctl is not None:
            stream.max_lag = self.lag_ctl.update(metrics)
            metrics["async/max_lag"] = float(stream.max_lag)

    def produce(self, batch_number: int) -> RolloutBatch | None:
        """Batch `batch_number`'s rollout, scored (the reward function runs here, in the producer's thread
        under --async_train). Called with the engines held (EngineGate), so their version is fixed."""
        version = self.gate.version  # the oldest weights any token of this batch is sampled with
        state = self.source_state()  # where a batch that lost an engine is sampled again from
        try:
            samples, consumed, metrics = self.recovery.run(
                self.next_samples, batch_number - 1, lambda: self.restore_source(state)
            )  # fmt: skip
            if samples is not None:
                samples.rewards = self.builder.rewards(samples)
        except RewardFileError as e:
            raise RewardFileError(f"step {batch_number}: {e}") from e.__cause__
        except AgentFileError as e:  # every episode failed: the file, then the step, then why
            path, _, why = str(e).partition(": ")
            raise AgentFileError(f"{path}: step {batch_number}: {why}") from e.__cause__
        if samples is None:
            return None
        samples.policy_version = torch.full((len(samples.prompts),), version, dtype=torch.long)
        return RolloutBatch(samples, metrics, consumed, self.source_state())

    def next_samples(self):
        """(samples, dataset indices consumed, metrics): a batch from the prompt stream (topped up under
        dynamic filtering); samples None when the stream has run out."""
        batch = self.loader.take(self.cfg.rollout_batch_size)
        if len(batch) < self.cfg.rollout_batch_size:
            return None, [], {}
        generate = lambda records: self.source.generate(records, self.cfg.n_samples_per_prompt)
        if self.cfg.dynamic_filtering_reward_range is None:
            return generate([r for _, r in batch]), [i for i, _ in batch], {}
        return generate_filtered(
            generate, self.builder.rewards, batch, self.loader.take, self.cfg.rollout_batch_size,
            self.cfg.dynamic_filtering_reward_range,
        )  # fmt: skip

    def rollout_metrics(self, batch: RolloutBatch, stream, waited: float, busy_from: float, step_s: float) -> dict:
        """Staleness of the trained rows (policy versions between the weights that sampled them and the
        weights that train on them: 0 when synchronous) and, under --async_train, who waited for whom."""
        staleness = (self.step - batch.samples.policy_version).float()
        m = {"async/staleness_mean": float(staleness.mean()), "async/staleness_max": float(staleness.max())}
        if batch.samples.token_version is not None:  # --partial_rollout: how fresh each response token is
            tokens = batch.samples.action_mask
            lag = self.step - batch.samples.token_version
            most = self.cfg.async_queue_size if self.cfg.async_train else self.cfg.rollout_staleness + 1
            for d in range(most + 1):
                m[f"async/partial_tokens_lag{d}"] = float(((lag == d) & tokens).sum() / tokens.sum().clamp(min=1))
            versions = batch.samples.token_version.masked_fill(~tokens, -1)
            oldest = batch.samples.token_version.masked_fill(~tokens, 1 << 62).min(-1).values
            m["async/partial_mixed_rows"] = float((versions.max(-1).values > oldest).float().mean())
            # versions are non-decreasing along a row: each change of version starts one more
            changes = (versions[:, 1:] != versions[:, :-1]) & tokens[:, 1:] & tokens[:, :-1]
            m["async/partial_versions_per_row"] = float((1 + changes.sum(-1)).float().mean())
        if self.cfg.async_train:
            m["async/trainer_wait_s"] = waited
            m["async/producer_wait_s"] = batch.gate_wait_s
            m["async/overlap_frac"] = stream.busy_seconds(busy_from, time.perf_counter()) / step_s
        return m

    def old_log_probs_needed(self, samples) -> bool:
        """Whether make_experience must run the policy's forward for the old log-probs. Not when the step
        trains the policy once on one mini-batch: the weights are then those that computed the old log-probs,
        so the training forward's own log-probs (detached) are the same numbers and the policy uses those
        (TRL does the same with num_iterations=1). Saves one forward pass over the batch per step."""
        one_pass = self.cfg.max_epochs == 1 and len(samples.prompts) <= self.cfg.train_batch_size
        trains_policy = self.step + 1 > self.cfg.freezing_actor_steps
        routed = samples.routes is not None  # the engine's routes: the old forward measures routing/* against them
        return (
            self.cfg.recompute_old_log_probs or self.builder.needs_old_log_probs() or not (one_pass and trains_policy)
            or routed
        )  # fmt: skip

    def evaluate(self) -> dict[str, float]:
        """Between steps, with the engines held: under --async_train no rollout is generated meanwhile; under
        --rollout_staleness the engines hold the newest weights while it runs (the policy trained so far)."""
        with self.gate.exclusive(), self.weight_sync.newest():
            return self.eval_set.run(self.source.sampler, self.builder.score)

    def keep_best(self, step: int, evaluation: dict[str, float]) -> None:
        """--best_metric_key: save the policy (HF format) when this evaluation beats every earlier one."""
        key = self.cfg.best_metric_key
        if not key:
            return
        if key not in evaluation:  # the short form, pass@1 (train_ppo_ray.py checked that it names one)
            key = f"eval/{self.eval_set.name}/{key}"
        value = evaluation[key]
        if self.best is not None and value <= self.best["value"]:
            return
        out = self.cfg.best_model_dir
        ray.get([p.save_hf.remote(str(out)) for p in self.policy])
        self.best = {"step": step, "key": key, "value": value}
        (out / best_model.RECORD).write_text(json.dumps(self.best) + "\n")
        tqdm.write(f"[best] {key} = {value:.4f} at step {step}: saved {out}")

    def record(self, step: int, metrics: dict[str, float], samples, rewards: torch.Tensor) -> None:
        self.builder.kl_ctl.update(metrics.get("kl/ref_kl_mean", 0.0), int(metrics["rollout/num_samples"]))
        if step == 1 and "rollout/logprob_abs_diff_mean" in metrics:  # both sides still hold the same weights
            cfg = self.cfg
            tqdm.write(agreement_line(metrics, cfg.sync_dtype, cfg.trainer_dtype, cfg.engine_quantization))
        self.history.append({"step": step, **metrics})
        self.logger.log(step, metrics, sinks=step % self.cfg.logging_steps == 0 or step == 1)
        if self.cfg.samples_log_steps > 0 and step % self.cfg.samples_log_steps == 0:
            self.logger.log_samples(step, samples.prompts, samples.responses, rewards)

    def export_sidecars(self, step: int, exp: Experience) -> None:
        """Agent episodes' step_meta / step_rewards_ext, one row per trained sequence, to agent_steps.jsonl."""
        if exp.step_meta is None:
            return
        for row, (meta, ext) in enumerate(zip(exp.step_meta, exp.step_rewards_ext, strict=True)):
            self.logger.write("agent_steps", {"step": step, "row": row, "step_meta": meta, "step_rewards_ext": ext})

    # ------------------------------------------------------------------ checkpoints
    def maybe_save(self, step: int) -> None:
        """Checkpoint after `step` when --save_steps divides it, or when --auto_checkpoint_minutes of training
        passed since the last checkpoint (or the start)."""
        ckpt, now = self.cfg.checkpoints, time.monotonic()
        if ckpt is None:
            return
        by_steps = ckpt.save_steps > 0 and step % ckpt.save_steps == 0
        by_clock = ckpt.every_s > 0 and now - self.last_saved >= ckpt.every_s
        if not (by_steps or by_clock):
            return
        self.last_saved, start = now, time.perf_counter()
        try:
            final = save_checkpoint(ckpt.ckpt_path, step, self.trainer_state(), self._write_model_states)
        except CheckpointClash as e:  # never another run's checkpoint overwritten: this one is skipped, said
            tqdm.write(f"[checkpoint] {e}")
            return
        deleted = rotate(ckpt.ckpt_path, ckpt.max_ckpt_num, ckpt.max_ckpt_mem, ckpt.run_id)
        note = f"; removed {', '.join(d.name for d in deleted)}" if deleted else ""
        tqdm.write(f"[checkpoint] {final} ({time.perf_counter() - start:.2f} s{note})")

    def _write_model_states(self, tmp: Path) -> None:
        ckpt, refs = self.cfg.checkpoints, []
        if not ckpt.disable_ds_ckpt:
            refs += [p.save_checkpoint.remote(str(tmp / "policy")) for p in self.policy]
            refs += [c.save_checkpoint.remote(str(tmp / "critic")) for c in self.critic or []]
        if ckpt.save_hf_ckpt:
            refs += [p.save_hf.remote(str(tmp / "policy_hf")) for p in self.policy]
        ray.get(refs)
        best_model.keep_in_checkpoint(self.cfg.best_model_dir, self.best, tmp)

    def source_state(self) -> dict:
        """Where the rollout side stands: the prompt stream and the source's own state (self-play's question
        sampler)."""
        return {"loader": self.loader.state_dict(), "source": self.source.state_dict()}

    def restore_source(self, state: dict) -> None:
        """The prompt stream and the rollout source back at `state` (source_state()): a batch sampled again."""
        self.loader.load_state_dict(state["loader"])
        self.source.load_state_dict(state["source"])

    def trainer_state(self) -> dict:
        """The source is saved as it was after the last *trained* batch: under --async_train the producer has
        taken prompts further, and those batches are regenerated after a resume (rollout_stream.py)."""
        return {
            "episode": self.trained_source["loader"]["position"] // max(1, self.loader.per_episode),  # for readers
            **self.trained_source,
            **self.builder.state_dict(),  # kl_coef, reward_moments
            "best": self.best,
            "resumable": not self.cfg.checkpoints.disable_ds_ckpt,  # checkpoint.find_latest skips it otherwise
            "run_id": self.cfg.checkpoints.run_id,
            "python_random": random.getstate(),
            "torch_rng": torch.get_rng_state().tolist(),
        }

    def restore(self, ckpt: Path) -> None:
        """Continue from checkpoint directory `ckpt`: model states into the workers, counters and RNGs here."""
        state = load_state(ckpt)
        if not (ckpt / "policy").is_dir():
            raise FileNotFoundError(f"{ckpt}: no DeepSpeed state to resume from (saved with --disable_ds_ckpt)")
        refs = [p.load_checkpoint.remote(str(ckpt / "policy")) for p in self.policy]
        refs += [c.load_checkpoint.remote(str(ckpt / "critic")) for c in self.critic or []]
        ray.get(refs)
        self.step = state["step"]
        self.gate = EngineGate(self.step)
        self.loader.load_state_dict(state["loader"])
        self.builder.load_state_dict(state)
        self.source.load_state_dict(state.get("source") or _older_source_state(state))
        self.best, said = best_model.put_back(self.cfg.best_model_dir, state.get("best"), ckpt)
        if said:
            tqdm.write(said)
        version, internal, gauss = state["python_random"]
        random.setstate((version, tuple(internal), gauss))
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
        self.trained_source = self.source_state()

    def train(self, exp: Experience, step: int) -> dict[str, float]:
        """`max_epochs` passes over the rollout batch in shuffled mini-batches of about train_batch_size
        (self-play batches vary in size: they are cut into ceil(rows / train_batch_size) equal parts).
        The metrics of every micro-batch of every rank are merged once, each by its own reduction
        (algos/stats.py), so they describe the whole batch whatever the sharding."""
        gen = torch.Generator().manual_seed(self.cfg.seed * 100_003 + step)
        train_policy = step > self.cfg.freezing_actor_steps
        parts: list[dict[str, Stat]] = []
        old_log_probs = torch.zeros(exp.action_mask.shape) if exp.old_log_probs is None else None
        lengths = exp.attention_mask.sum(-1)
        for _ in range(self.cfg.max_epochs):
            order = torch.randperm(len(exp), generator=gen)
            for rows in torch.tensor_split(order, math.ceil(len(exp) / self.cfg.train_batch_size)):
                rows = length_grouped(rows, lengths, ActorGroup.of(self.policy).data_parallel)
                stats, trained_log_probs = self._train_minibatch(exp.select(rows), train_policy)
                parts += stats
                if old_log_probs is not None:
                    old_log_probs[rows] = trained_log_probs
        metrics = reduce_stats(parts, passes=self.cfg.max_epochs)
        if old_log_probs is not None:  # filled by the policy's training forward (old_log_probs_needed)
            exp.old_log_probs = old_log_probs
            metrics.update(self.builder.old_log_prob_metrics(exp))
        return metrics

    def _train_minibatch(
        self, mini: Experience, train_policy: bool
    ) -> tuple[list[dict[str, Stat]], torch.Tensor | None]:
        """One optimizer step of the policy (and critic) on `mini`: (every rank's metrics, the policy's detached
        training log-probs (B, T) when mini.old_log_probs is None, else None)."""
        tokens = float(mini.action_mask.sum())
        seqs = float((mini.action_mask.sum(-1) > 0).sum())
        critic_refs = self._shard_train(self.critic, mini, tokens, seqs) if self.critic else []
        kl_coef = float(self.builder.kl_ctl.value)  # the --use_kl_loss coefficient: the one kl/coef logs
        policy_refs = self._shard_train(self.policy, mini, tokens, seqs, kl_coef) if train_policy else []
        stats = ray.get(critic_refs)
        if not policy_refs:
            return stats, None
        results = ActorGroup.of(self.policy).speakers(ray.get(policy_refs))
        stats += [r[0] for r in results]
        log_probs = torch.cat([r[1] for r in results]) if mini.old_log_probs is None else None
        return stats, log_probs

    def _shard_train(self, group: list, mini: Experience, tokens: float, seqs: float, *extra) -> list:
        """train_minibatch on every rank of `group`, each on its shard of `mini` cut into micro-batches;
        `extra`: further arguments of that call (the policy's KL coefficient)."""
        group = ActorGroup.of(group)
        shards = group.shards(len(mini))
        # every rank runs the same number of micro-batches: ZeRO's gradient collectives must pair up
        if self.cfg.train_max_tokens is None:
            num_micro = math.ceil(len(shards[0]) / self.cfg.micro_train_batch_size)
            split = split_experience
        else:  # as many as the rank that needs the most, within the token budget
            lengths = mini.attention_mask.sum(-1)
            packed, budget = self.cfg.packing_samples, self.cfg.train_max_tokens
            needed = max(len(budget_chunks(lengths[idx].tolist(), budget, packed)) for idx in shards)
            num_micro = min(needed, min(len(idx) for idx in shards))
            split = lambda exp, parts: split_by_tokens(exp, parts, packed)  # noqa: E731
        return group.call_sharded(
            "train_minibatch", len(mini), lambda idx: (split(mini.select(idx), num_micro), tokens, seqs, *extra)
        )

    def sync_weights(self, version: int) -> None:
        """Push the policy's weights (version = optimizer steps taken) to every rollout engine
        (trainer/weight_sync.py: through the object store, or by broadcast); an engine lost mid-push is started
        again and the push repeated (trainer/engine_recovery.py)."""
        self.recovery.run(lambda: self.weight_sync.push(version, self.gate), self.step, hold=self.gate.exclusive())


def _older_source_state(state: dict) -> dict:
    """Checkpoints written before the rollout sources existed kept self-play's RNG as "maker_rng"."""
    return {"rng": state["maker_rng"]} if state.get("maker_rng") is not None else {}


def length_grouped(rows: torch.Tensor, lengths: torch.Tensor, ranks: int) -> torch.Tensor:
    """The rows of one mini-batch reordered so that each rank's consecutive shard (ActorGroup.shards) holds
    every `ranks`-th row of them sorted by length: its micro-batches hold rows of similar length, which
    Experience.trim_padding then cuts to their own longest instead of the batch's, and the ranks get
    similar work. The loss sums over the whole mini-batch, so only the order of float additions changes."""
    by_length = rows[torch.argsort(lengths[rows], stable=True)]
    return torch.cat([by_length[rank::ranks] for rank in range(ranks)])
