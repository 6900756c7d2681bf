"""Samples -> Experience (log-probs, values, rewards, KL, advantages): the learner side of a step. Where the
Samples come from is the rollout side's business (rollout/sampler.py and the rollout sources)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import ray
import torch

from reinforce_pro.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs, compute_advantages
from reinforce_pro.algos.distill import DistillConfig, distill_advantages, distill_metrics
from reinforce_pro.algos.is_correction import position_buckets
from reinforce_pro.algos.kl import compute_approx_kl
from reinforce_pro.algos.length_penalty import apply_length_penalties
from reinforce_pro.algos.masked import masked_mean
from reinforce_pro.experience import Experience, Samples
from reinforce_pro.flagspec import flag
from reinforce_pro.rewards.loader import (
    NAN_POLICIES,
    NONFINITE_KEY,
    RewardFileError,
    RewardOutput,
    normalize_reward_output,
)
from reinforce_pro.rollout.teacher_engines import EngineTeacher
from reinforce_pro.workers.group import ActorGroup


@dataclass
class ExperienceConfig:
    """What a batch of samples is turned into: rewards shaped and checked, KL, advantages."""

    max_new_tokens: int = 1024  # the length the overlong and stop-properly penalties measure against
    # fmt: off
    advantage_estimator: str = flag("gae", "advantages", dotted="algo.advantage.estimator",
        choices=ADVANTAGE_ESTIMATORS, group="training")
    gamma: float = flag(1, "discount", dotted="algo.advantage.gamma", group="training")
    lambd: float = flag(1, "GAE lambda", dotted="algo.advantage.lambd", group="training")
    std_norm: bool = True
    reward_clip_range: tuple[float, float] | None = (-10.0, 10.0)
    # rewards/loader.py applies it
    reward_nan_policy: str = flag("error",
        "non-finite rewards from the reward function: error (stop the run, one line), zero (use 0), drop (use 0 and "
        "train on none of the row's tokens); zero and drop log reward/nonfinite, the fraction of rows",
        choices=NAN_POLICIES, group="training")
    # algos/length_penalty.py
    overlong_buffer_len: float | None = flag(None, "DAPO: penalise the last B tokens before the limit",
        dotted="reward.overlong_buffer_len", group="training")
    overlong_penalty_factor: float = flag(1, "DAPO: the penalty at the token limit",
        dotted="reward.overlong_penalty_factor", at_least=0, group="training")
    stop_properly_penalty_coef: float | None = flag(None, "ProRL: truncated rewards x c (c<0: set to c)",
        dotted="reward.stop_properly_penalty_coef", group="training")
    normalize_reward: bool = flag(False, "standardise rewards with running moments", dotted="reward.normalize_enable",
        group="training")
    # fmt: on
    kl_estimator: str = "k1"
    use_kl_loss: bool = False  # KL in the loss (the policy's), not in the reward
    routing_replay: str = "none"  # MoE: none / r2 / r3, whose routes the forwards replay (models/routing.py)


# Under --routing_replay r3 the gap replay closes is measured with one more forward of the policy, on the first
# batch and every this many after (benchmarks/bench_routing_replay.py: at every step it was most of what r3 adds).
UNREPLAYED_EVERY = 10


class RunningMoments:
    """Running mean / std of rewards over the whole run (Chan et al. parallel update), for --normalize_reward."""

    def __init__(self) -> None:
        self.mean, self.var, self.count = 0.0, 1.0, 1e-8

    def update(self, x: torch.Tensor) -> None:
        n, mean, var = x.numel(), float(x.mean()), float(x.var(unbiased=False))
        delta, total = mean - self.mean, self.count + n
        self.var = (self.var * self.count + var * n + delta**2 * self.count * n / total) / total
        self.mean, self.count = self.mean + delta * n / total, total

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / math.sqrt(max(self.var, 1e-8))


class ExperienceBuilder:
    """Samples -> Experience: the policy's old log-probs, the reference's, the critic's values, rewards, KL and
    advantages. Owns the state that must survive a resume (the adaptive KL coefficient, the running reward
    statistics of --normalize_reward) and hands it out as state_dict / load_state_dict."""

    def __init__(
        self, policy, reference, critic, reward_fn: Callable | None, cfg: ExperienceConfig, kl_ctl, teacher=None,
        distill: DistillConfig | None = None,
    ):  # fmt: skip
        """teacher / distill: on-policy distillation's frozen teacher group and its settings (algos/distill.py)."""
        self.policy, self.reference, self.critic = policy, reference, critic
        self.teacher, self.distill = (teacher, distill) if teacher is not None else (None, None)
        self.reward_fn, self.cfg, self.kl_ctl = reward_fn, cfg, kl_ctl
        self.reward_moments = RunningMoments()
        self.old_forwards = 0  # batches scored by old_forward so far

    def state_dict(self) -> dict:
        """What a resume must restore of the experience side: the adaptive KL coefficient and the running
        reward statistics (--normalize_reward)."""
        return {"kl_coef": self.kl_ctl.value, "reward_moments": vars(self.reward_moments).copy()}

    def load_state_dict(self, state: dict) -> None:
        self.kl_ctl.value = state["kl_coef"]
        vars(self.reward_moments).update(state["reward_moments"])

    def rewards(self, samples: Samples) -> RewardOutput:
        """The samples' rewards: those their rollout source already gave (an agent's environment, a self-play
        task), else the reward function's."""
        if samples.rewards is not None:
            return samples.rewards
        return self.score(samples.prompts, samples.responses, samples.labels)

    def score(self, prompts: list[str], responses: list[str], labels: list) -> RewardOutput:
        """The reward function on prompt + response texts (OpenRLHF's queries), normalised."""
        queries = [p + r for p, r in zip(prompts, responses, strict=True)]
        try:
            out = self.reward_fn(queries, prompts, labels)
        except Exception as e:  # user code: reported as a one-line error by the CLI (run/driver.py)
            raise RewardFileError(f"reward_func raised {type(e).__name__}: {e}") from e
        return normalize_reward_output(out, len(queries), self.cfg.reward_nan_policy)

    def needs_old_log_probs(self) -> bool:
        """Whether the experience needs the policy's log-probs before training: the KL penalty in the
        reward is computed from them. Otherwise the trainer may skip that forward (see PPOTrainer)."""
        kl_in_reward = self.reference is not None and not self.cfg.use_kl_loss
        return kl_in_reward or (self.distill is not None and self.distill.opd_student_logprobs == "trainer")

    def make_experience(self, samples: Samples, old_log_probs: bool = True) -> tuple[Experience, dict[str, float]]:
        """`old_log_probs=False`: leave Experience.old_log_probs None (the policy's training forward
        supplies them; the trainer then logs `old_log_prob_metrics` after training)."""
        seq, attn, t = samples.sequences, samples.attention_mask, samples.num_actions
        mode = self.cfg.routing_replay
        if mode == "r3" and samples.routes is None:  # replaying nothing would train on the trainer's own routes
            raise ValueError(
                "--routing_replay r3: these rows carry no engine routes (the rollout engine captured none)"
            )
        scored = self.old_forward(samples) if old_log_probs else {}
        old_lp, outside, unreplayed = scored.get("log_probs"), scored.get("outside"), scored.get("unreplayed")
        r3 = samples.routes if mode == "r3" else None
        ref_lp = _sharded_call(self.reference, "log_probs", seq, attn, t, r3) if self.reference else None
        values = _sharded_call(self.critic, "values", seq, attn, t) if self.critic else None
        teacher_lp = self.teacher_log_probs(seq, attn, t) if self.teacher is not None else None
        reward = self.rewards(samples)
        action_mask = samples.action_mask
        if self.cfg.reward_nan_policy == "drop" and NONFINITE_KEY in reward.extra_logs:
            action_mask = action_mask & (reward.extra_logs[NONFINITE_KEY] == 0).unsqueeze(1)  # no tokens trained
        rewards, penalty_metrics = apply_length_penalties(
            reward.rewards, samples.attention_mask[:, -samples.num_actions :].sum(-1), samples.truncated,
            self.cfg.max_new_tokens, self.cfg.overlong_buffer_len, self.cfg.overlong_penalty_factor,
            self.cfg.stop_properly_penalty_coef,
        )  # fmt: skip
        if self.cfg.normalize_reward:
            self.reward_moments.update(rewards)
            rewards = self.reward_moments.normalize(rewards)
        kl = None  # only the reward penalty needs it before training (needs_old_log_probs)
        if ref_lp is not None and old_lp is not None:
            kl = compute_approx_kl(self.cfg.kl_estimator, old_lp, ref_lp, samples.action_mask)
        advantages, returns = self.advantages(samples, rewards, kl, values)
        advantages, opd_metrics = self.distilled(advantages, teacher_lp, old_lp, samples.rollout_log_probs, action_mask)
        exp = Experience(
            sequences=seq,
            attention_mask=attn,
            action_mask=action_mask,
            old_log_probs=old_lp,
            rollout_log_probs=samples.rollout_log_probs,
            advantages=advantages,
            returns=returns,
            rewards=rewards,
            ref_log_probs=ref_lp,
            values=values,
            info={"score": reward.scores},
            step_meta=samples.step_meta,
            step_rewards_ext=samples.step_rewards_ext,
            routes=r3 if mode != "r2" else scored.get("own_routes"),  # r2 without an old forward: nothing moved
        )
        metrics = {**self._metrics(samples, reward), **penalty_metrics, **samples.metrics, **opd_metrics}
        if "flips" in scored:
            metrics.update(routing_metrics(scored["flips"], action_mask, replayed=mode == "r3"))
        if old_lp is not None:
            metrics.update(self.old_log_prob_metrics(exp))
            action = exp.action_mask.bool()
            if action.any() and not outside.isnan().any():  # a filter was replayed (models/sampling_filter.py)
                metrics["rollout/outside_filter_frac"] = float(outside[action].mean())
        if unreplayed is not None:
            metrics["routing/logprob_abs_diff_unreplayed_mean"] = gap_mean(unreplayed, samples.rollout_log_probs,
                                                                           action_mask)  # fmt: skip
        return exp, metrics

    def distilled(self, advantages, teacher_lp, old_lp, rollout_lp, action_mask) -> tuple[torch.Tensor, dict]:
        """With a teacher: the task's advantages x --opd_task_coef plus --opd_kl_coef x the distillation advantage
        (teacher - student log-prob per token, algos/distill.py; the student's the trainer's old log-probs or the
        engine's, as --opd_student_logprobs says), and the opd/* metrics. Without one: `advantages` unchanged."""
        if teacher_lp is None:
            return advantages, {}
        student_lp = old_lp if self.distill.opd_student_logprobs == "trainer" else rollout_lp
        if student_lp is None:
            raise ValueError("--opd_student_logprobs trainer needs the policy's old log-probs (old_log_probs=True)")
        opd = distill_advantages(teacher_lp, student_lp, action_mask)
        metrics = distill_metrics(teacher_lp, student_lp, action_mask, self.distill.opd_kl_estimator)
        metrics["opd/advantage_mean"] = float(masked_mean(opd, action_mask))
        return self.distill.opd_task_coef * advantages + self.distill.opd_kl_coef * opd, metrics

    def teacher_log_probs(self, sequences, attention_mask, num_actions: int) -> torch.Tensor:
        """(B, T) the teacher's log-probs of the sampled tokens: its engines' prompt log-probs (EngineTeacher), or
        its actor group's forward, rows split over its ranks."""
        if isinstance(self.teacher, EngineTeacher):
            return self.teacher.log_probs(sequences, attention_mask, num_actions)
        return _sharded_call(self.teacher, "log_probs", sequences, attention_mask, num_actions)

    def old_forward(self, samples: Samples) -> dict:
        """The policy's score() of the rollout (its log-probs, with the tokens the trainer's replay of the
        engine's filter would have removed, and an MoE policy's routing); under --routing_replay r3, for the first
        batch and every UNREPLAYED_EVERY-th after, also "unreplayed": the log-probs of the same forward routing
        itself, for the gap replay closes."""
        seq, attn, t, routes = samples.sequences, samples.attention_mask, samples.num_actions, samples.routes
        scored = _sharded_call(self.policy, "score", seq, attn, t, routes)
        self.old_forwards += 1
        if self.cfg.routing_replay == "r3" and (self.old_forwards - 1) % UNREPLAYED_EVERY == 0:
            scored["unreplayed"] = _sharded_call(self.policy, "score_unreplayed", seq, attn, t, routes)["log_probs"]
        return scored

    def old_log_prob_metrics(self, exp: Experience) -> dict[str, float]:
        """What is read off the old log-probs: the rollout/trainer mismatch before any update of this step
        (the quantity IS correction fights) and, with a reference model, the KL to it."""
        diff = (exp.old_log_probs - exp.rollout_log_probs).abs()
        action = exp.action_mask.bool()
        finite = action & torch.isfinite(diff)  # an engine's NaN / -inf log-prob: counted, kept out of the gap
        tokens = diff[finite]
        m = {
            "rollout/logprob_abs_diff_mean": float(masked_mean(torch.where(finite, diff, 0.0), finite)),
            "rollout/logprob_abs_diff_p99": float(tokens.float().quantile(0.99)) if tokens.numel() else 0.0,
            "rollout/logprob_abs_diff_max": float(tokens.max()) if tokens.numel() else 0.0,
            "rollout/logprob_nonfinite_frac": float((action & ~finite).sum() / action.sum().clamp(min=1)),
        }
        if action.size(-1):  # where along the responses the gap is: the drift picture's rows (drift_plot.py)
            bucket, names = position_buckets(action)
            gap = torch.where(finite, diff, 0.0)
            for b, name in enumerate(names):
                m[f"rollout_pos/logprob_abs_diff/{name}"] = float(masked_mean(gap, finite & (bucket == b)))
        if exp.ref_log_probs is not None:
            kl = compute_approx_kl(self.cfg.kl_estimator, exp.old_log_probs, exp.ref_log_probs, exp.action_mask)
            m["kl/ref_kl_mean"] = float(masked_mean(kl, exp.action_mask))
            m["kl/coef"] = float(self.kl_ctl.value)
        return m

    def advantages(self, samples: Samples, rewards, kl, values) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) advantages and returns, computed separately for each of samples.advantage_segments (self-play
        keeps solver groups and proposer samples apart), by default the whole batch as one segment. Extra segments
        of agent episodes (samples.fork_of) take their episode's advantage (the mean over its lead row's tokens)."""
        forks = len(samples.fork_of or [])
        leads = len(rewards) - forks
        segments = samples.advantage_segments or [(0, leads, samples.group_size)]
        advantages = torch.zeros(samples.action_mask.shape, dtype=torch.float32)
        returns = torch.zeros_like(advantages)
        for start, end, group_size in segments:
            rows = slice(start, end)
            inp = AdvantageInputs(
                rewards=rewards[rows],
                action_mask=samples.action_mask[rows],
                group_size=group_size,
                kl=kl[rows] if kl is not None else None,
                kl_coef=0.0 if self.cfg.use_kl_loss else self.kl_ctl.value,
                values=values[rows] if values is not None else None,
                gamma=self.cfg.gamma,
                lambd=self.cfg.lambd,
                std_norm=self.cfg.std_norm,
                reward_clip_range=self.cfg.reward_clip_range,
                turn_rewards=samples.turn_rewards[rows] if samples.turn_rewards is not None else None,
            )
            advantages[rows], returns[rows] = compute_advantages(self.cfg.advantage_estimator, inp)
        for k, lead in enumerate(samples.fork_of or []):
            row, mask = leads + k, samples.action_mask[leads + k].float()
            lead_mask = samples.action_mask[lead]
            advantages[row] = masked_mean(advantages[lead], lead_mask) * mask
            returns[row] = masked_mean(returns[lead], lead_mask) * mask
        return advantages, returns

    def _metrics(self, samples: Samples, reward: RewardOutput) -> dict[str, float]:
        lengths = samples.action_mask.sum(-1).float()
        m = {
            "rollout/reward_mean": float(reward.rewards.mean()),
            "rollout/reward_std": float(reward.rewards.std()) if len(reward.rewards) > 1 else 0.0,
            "rollout/score_mean": float(reward.scores.mean()),
            "rollout/response_length_mean": float(lengths.mean()),
            "rollout/truncated_frac": float(samples.truncated.float().mean()),
            "rollout/num_samples": float(len(lengths)),
        }
        for k, v in reward.extra_logs.items():
            m[f"reward/{k}"] = float(v.mean())
        return m


# The largest mean |engine - trainer| log-prob that rounding alone gives on equal weights, by the less precise
# side's dtype: fp32 kernels of the two sides differ far below 1e-4; bf16 keeps 8 significant bits and fp16 11,
# about 1e-2 and 1e-3 of a log-prob (docs/metrics.md). Above it the two sides do not compute the same thing.
DTYPE_NOISE = {"float32": 1e-4, "fp32": 1e-4, "float16": 1e-2, "fp16": 1e-2, "bfloat16": 5e-2, "bf16": 5e-2}


def agreement_line(metrics: dict[str, float], engine_dtype: str, trainer_dtype: str, quantization: str | None) -> str:
    """One line, at the first step (engine and trainer on the same weights): whether the gap between their
    log-probs is the noise the two dtypes explain, or something else (docs/metrics.md: reading it)."""
    gap, p99, top = (metrics[f"rollout/logprob_abs_diff_{k}"] for k in ("mean", "p99", "max"))
    sides = f"engine {engine_dtype}{f' ({quantization})' if quantization else ''} vs trainer {trainer_dtype}"
    head = (
        f"[agreement] step 1, {sides} on the same weights: mean |log-prob gap| {gap:.1e} (p99 {p99:.1e}, max {top:.1e})"
    )
    if "routing/flip_frac" in metrics:  # an MoE model: how often the two sides' routers disagreed
        replayed = ", then replayed the engine's" if metrics["routing/replayed"] else ""
        head += f"; experts differ at {metrics['routing/flip_frac']:.2%} of (token, layer) pairs{replayed}"
        if "routing/logprob_abs_diff_unreplayed_mean" in metrics:
            head += f" (mean gap without replay {metrics['routing/logprob_abs_diff_unreplayed_mean']:.1e})"
    if quantization:
        return f"{head}: a quantised engine has no rounding bound; read it as the quantisation's cost"
    bound = max(DTYPE_NOISE.get(engine_dtype, 5e-2), DTYPE_NOISE.get(trainer_dtype, 5e-2))
    if gap <= bound:
        return f"{head}: rounding noise (up to {bound:.0e} for these dtypes)"
    return (
        f"{head}: above the {bound:.0e} rounding explains; the two sides differ in more than precision (a sampling "
        "setting, a kernel, the tokenizer or chat template, or weights the engine did not get)"
    )


def gap_mean(log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, action_mask: torch.Tensor) -> float:
    """Mean |trainer - engine| log-prob over the action tokens where both are finite."""
    diff = (log_probs - rollout_log_probs).abs()
    finite = action_mask.bool() & torch.isfinite(diff)
    return float(masked_mean(torch.where(finite, diff, 0.0), finite))


def routing_metrics(flips: torch.Tensor, action_mask: torch.Tensor, replayed: bool) -> dict[str, float]:
    """routing/*: how often the trainer's own top-k experts differ from the engine's (before any replay), over
    the positions that predict response tokens: (B, T, L) flips, NaN where the engine gave no routes."""
    known = action_mask.bool().unsqueeze(-1) & ~flips.isnan()
    if not known.any():
        return {}
    flipped = torch.where(known, flips, 0.0)
    m = {
        "routing/flip_frac": float(flipped.sum() / known.sum()),
        "routing/token_flip_frac": float(flipped.amax(-1)[known.any(-1)].mean()),
        "routing/row_flip_frac": float(flipped.amax(-1).amax(-1)[known.any(-1).any(-1)].mean()),
        "routing/replayed": float(replayed),
    }
    for layer in range(flips.size(-1)):
        m[f"routing/flip_frac/layer{layer}"] = float(masked_mean(flipped[..., layer], known[..., layer]))
    bucket, names = position_buckets(action_mask)
    for b, name in enumerate(names):
        where = known & (bucket == b).unsqueeze(-1)
        m[f"routing_pos/flip_frac/{name}"] = float(masked_mean(flipped, where))
    return m


def _sharded_call(group: list, method: str, sequences, attention_mask, num_actions, routes=None):
    """Split rows across the data-parallel ranks of `group`, call `method` on each (with each shard's `routes`
    when given), concatenate (a dict result key by key)."""
    group = ActorGroup.of(group)

    def args_of(idx):
        rows = (sequences[idx], attention_mask[idx], num_actions)
        return rows if routes is None else (*rows, routes[idx])

    results = group.speakers(ray.get(group.call_sharded(method, sequences.size(0), args_of)))
    if isinstance(results[0], dict):
        return {key: torch.cat([r[key] for r in results], dim=0) for key in results[0]}
    return torch.cat(results, dim=0)
