"""Steps 1-10 of the Absolute-Zero step (docs/selfplay.md): propose, validate, solve, score, learnability,
the repropose loop, and the training samples with their rewards.

The controller sees the rollout engines only through `generate(prompts, sampling) -> list[Rollout]` (sampling:
the task's overrides for the role, or None) and, for the solver, `solve(questions, sampling) -> list[Rollout]`
(by default: `generate` on the task's solver prompts; for an agent task, multi-turn episodes: selfplay/solve.py),
so tests drive it with a scripted fake; SelfPlaySource passes the real engines.
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from reinforce_pro.flagspec import flag
from reinforce_pro.selfplay.learnability import (
    PROPOSER_REWARDS,
    combined_reward,
    graded_reward,
    is_learnable,
    plan_question_sampling,
    proposer_reward,
    question_reward,
    repetition_penalties,
    solver_reward,
)
from reinforce_pro.selfplay.tasks import Judge, ParsedQuestion, Question, ScoredResponses, SelfPlayTask

PROPOSER_SCOPES = ("sampled", "group")
SELFPLAY = "[reinforce_pro] --absolute_zero:"  # how the self-play flags' help begins


@dataclass
class Rollout:
    """One sampled response and the prompt it answers. `generation` is the engine's record (token ids,
    log-probs, finish reason); the controller only reads `text`."""

    prompt: str
    text: str
    generation: object = None
    # an OpenAI-SDK solver's episode whose history was rewritten (agents/trajectory.py): its earlier segments,
    # trained as extra rows with this rollout's reward and advantage
    forks: list = field(default_factory=list)


Generate = Callable[[list[str], dict | None], list[Rollout]]  # prompts, sampling overrides
Solve = Callable[[list[Question], dict | None], list[Rollout]]  # questions, the solver's sampling overrides


# the solver-reward weights of the dimensions named "safety" and "completion" (a task's other dimensions keep
# the task's own weights)
DEFAULT_WEIGHTS = {"safety": 0.7, "completion": 0.3}


@dataclass
class SelfPlayConfig:
    # fmt: off
    n_questions_per_prompt: int = flag(4, f"{SELFPLAY} questions proposed per seed prompt", at_least=1,
        group="selfplay")
    max_repropose_attempts: int = flag(3,
        f"{SELFPLAY} re-proposal rounds after the first proposal for prompts whose questions are all or none "
        "learnable (0: never re-propose)", at_least=0, group="selfplay")
    proposer_train_scope: str = flag("sampled",
        f"{SELFPLAY} sampled: train the sampled question's proposer trajectory only (1.0 / -0.5 unresolved); group: "
        "every proposed question (learnable 1.0, not 0.0, invalid the task's format penalty)", choices=PROPOSER_SCOPES,
        group="selfplay")
    # dimension -> weight in the solver reward (--safety_reward_weight, --task_completion_weight)
    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    format_reward_coef: float = flag(0.5, f"{SELFPLAY} weight of the solver's format reward", group="selfplay")
    proposer_reward_coef: float = flag(0.1,
        f"{SELFPLAY} a solver sample's reward adds this times its prompt's proposer reward", group="selfplay")
    reference_buffer: int = 0  # propose from the last N learnable questions instead of the seeds (0: seeds)
    repetition_penalty: float = 0.0  # proposer reward - coef * (share of the step's proposals with this text)
    proposer_reward: str = flag("learnable",
        f"{SELFPLAY} what a learnable question earns its proposer: learnable: 1.0; difficulty: 1 - the solver's "
        "success rate on it (Absolute Zero's r_propose: the hard edge of what the solver can do earns most)",
        choices=PROPOSER_REWARDS, group="selfplay")
    # fmt: on


@dataclass
class QuestionRecord:
    """One proposed question: its proposer trajectory and, when valid, its solver group and scores."""

    proposal: Rollout
    parsed: ParsedQuestion
    solutions: list[Rollout] = field(default_factory=list)  # rollout_n responses, empty when invalid
    scored: ScoredResponses | None = None
    learnable: bool = False


@dataclass
class PromptRecord:
    seed: dict
    questions: list[QuestionRecord] = field(default_factory=list)  # the latest attempt's group
    sampled: int = -1  # index of the sampled question; -1 = marked for re-proposal
    attempts: int = 0  # proposal rounds this prompt took part in

    @property
    def learnable_row(self) -> list[bool]:
        return [q.learnable for q in self.questions]


@dataclass
class TrainingSample:
    rollout: Rollout
    reward: float
    score: float  # the task score logged as rollout/score_mean (solver: mean dimension score; proposer: reward)
    role: str  # "solver" | "proposer"


@dataclass
class SelfPlayBatch:
    samples: list[TrainingSample]  # solver samples (rollout_n per kept question), then proposer samples
    segments: list[tuple[int, int, int]]  # (start, end, group size) for group-relative advantages
    metrics: dict[str, float]


class SelfPlayController:
    def __init__(
        self, task: SelfPlayTask, cfg: SelfPlayConfig, generate: Generate, judge: Judge | None = None,
        solve: Solve | None = None,
    ):  # fmt: skip
        if cfg.proposer_train_scope not in PROPOSER_SCOPES:
            raise ValueError(f"proposer_train_scope must be one of {PROPOSER_SCOPES}, got {cfg.proposer_train_scope}")
        if cfg.proposer_reward not in PROPOSER_REWARDS:
            raise ValueError(f"proposer_reward must be one of {PROPOSER_REWARDS}, got {cfg.proposer_reward}")
        missing = set(task.thresholds) - set(cfg.weights)
        if missing:
            raise ValueError(f"no solver-reward weight for the task's dimensions {sorted(missing)}")
        self.task, self.cfg, self.generate, self.judge = task, cfg, generate, judge
        self.solve = solve or (lambda qs, sampling: generate([task.solver_prompt(q) for q in qs], sampling))
        # Absolute Zero's reference examples: proposer prompts show a recent learnable question, so the
        # proposals move with what the solver can almost do instead of staying near the fixed seeds
        self.references: deque[Question] = deque(maxlen=max(1, cfg.reference_buffer))

    def step(self, seeds: Sequence[dict], n: int, rng: random.Random) -> SelfPlayBatch:
        """One self-play step over `seeds`, with `n` solver responses to each valid proposed question."""
        referenced = self.cfg.reference_buffer > 0 and bool(self.references)
        if referenced:  # every prompt shows a random buffered question instead of its seed
            seeds = [self.task.reference_record(rng.choice(self.references)) for _ in seeds]
        prompts = [PromptRecord(seed) for seed in seeds]
        stats = RoundStats()
        marked = list(range(len(prompts)))
        for _ in range(1 + self.cfg.max_repropose_attempts):
            self._attempt([prompts[i] for i in marked], stats, n)
            plan = plan_question_sampling([prompts[i].learnable_row for i in marked], rng)
            for i, sampled in zip(marked, plan, strict=True):
                prompts[i].sampled = sampled
            marked = [i for i in marked if prompts[i].sampled < 0]
            if not marked:
                break
        if self.cfg.reference_buffer > 0:
            self.references.extend(q.parsed.question for p in prompts for q in p.questions if q.learnable)
        batch = self._training_batch(prompts, stats, n)
        if self.cfg.reference_buffer > 0:
            batch.metrics["proposer/reference_frac"] = float(referenced)
            batch.metrics["proposer/reference_buffer_size"] = float(len(self.references))
        return batch

    # ------------------------------------------------------------------ steps 1-5 for some prompts
    def state_dict(self) -> dict:
        return {"references": [[q.text, q.answer, q.meta] for q in self.references]}

    def load_state_dict(self, state: dict) -> None:
        self.references.clear()
        self.references.extend(Question(text, answer, meta) for text, answer, meta in state.get("references", []))

    def _attempt(self, prompts: list[PromptRecord], stats: RoundStats, n: int) -> None:
        """Propose a new question group for each prompt, validate, solve, score, judge learnability."""
        k = self.cfg.n_questions_per_prompt
        sampling = self.task.sampling
        proposals = self.generate(
            [self.task.proposer_prompt(p.seed) for p in prompts for _ in range(k)], sampling.get("proposer")
        )
        records = [QuestionRecord(r, self.task.parse_question(r.text)) for r in proposals]
        valid = [q for q in records if q.parsed.valid]
        solutions = self.solve([q.parsed.question for q in valid for _ in range(n)], sampling.get("solver"))
        for j, q in enumerate(valid):
            q.solutions = solutions[j * n : (j + 1) * n]
            q.scored = self.task.score(q.parsed.question, [s.text for s in q.solutions], self.judge)
            q.learnable = is_learnable(q.scored.scores, self.task.thresholds)
        for i, p in enumerate(prompts):
            p.questions, p.attempts = records[i * k : (i + 1) * k], p.attempts + 1
        stats.add_round(records, first=stats.rounds == 0, task=self.task)

    # ------------------------------------------------------------------ steps 8-10
    def _training_batch(self, prompts: list[PromptRecord], stats: RoundStats, n: int) -> SelfPlayBatch:
        cfg = self.cfg
        samples: list[TrainingSample] = []
        segments: list[tuple[int, int, int]] = []
        repeats = repetition_penalties([text for text, _, _ in stats.questions], cfg.repetition_penalty)
        proposer_rewards = [
            self._prompt_reward(p) - (repeats[p.questions[p.sampled].parsed.question.text] if p.sampled >= 0 else 0.0)
            for p in prompts
        ]
        for p, p_reward in zip(prompts, proposer_rewards, strict=True):
            if p.sampled < 0:
                continue  # unresolved after the last attempt: no solver samples
            q = p.questions[p.sampled]
            for j, sol in enumerate(q.solutions):
                dims = {d: q.scored.scores[d][j] for d in self.task.thresholds}
                s_reward = solver_reward(dims, cfg.weights, q.scored.format[j], cfg.format_reward_coef)
                reward = combined_reward(s_reward, p_reward, cfg.proposer_reward_coef)
                samples.append(TrainingSample(sol, reward, sum(dims.values()) / len(dims), "solver"))
            segments.append((len(samples) - n, len(samples), n))
        num_solver = len(samples)
        start = len(samples)
        for p, p_reward in zip(prompts, proposer_rewards, strict=True):
            if cfg.proposer_train_scope == "sampled":
                q = p.questions[p.sampled] if p.sampled >= 0 else _fallback_question(p)
                samples.append(TrainingSample(q.proposal, p_reward, p_reward, "proposer"))
            else:
                group_start = len(samples)
                for q in p.questions:
                    earned = self._learnable_reward(q) if q.learnable else 0.0
                    r = question_reward(q.parsed.valid, q.learnable, self.task.format_penalty, earned)
                    r -= repeats[q.parsed.question.text] if q.parsed.valid else 0.0
                    samples.append(TrainingSample(q.proposal, r, r, "proposer"))
                segments.append((group_start, len(samples), len(samples) - group_start))
        if cfg.proposer_train_scope == "sampled":  # one proposer sample per prompt: the batch is the group
            segments.append((start, len(samples), len(samples) - start))
        metrics = stats.metrics(self.task.name, prompts, samples, num_solver, proposer_rewards)
        return SelfPlayBatch(samples, segments, metrics)

    def _learnable_reward(self, q: QuestionRecord) -> float:
        """What a learnable question earns its proposer (--proposer_reward: 1.0, or 1 - the solve rate)."""
        return graded_reward(q.scored.scores, self.task.thresholds, self.cfg.proposer_reward)

    def _prompt_reward(self, p: PromptRecord) -> float:
        """Sampled scope: the prompt's reward (learnability.proposer_reward), its learnable sampled question
        graded by --proposer_reward."""
        reward = proposer_reward(p.sampled, p.learnable_row, p.sampled < 0)
        if p.sampled >= 0 and p.questions[p.sampled].learnable:
            return self._learnable_reward(p.questions[p.sampled])
        return reward


def _fallback_question(p: PromptRecord) -> QuestionRecord:
    """The proposer trajectory that carries an unresolved prompt's -0.5: its last group's first valid
    question (or first question when none is valid)."""
    return next((q for q in p.questions if q.parsed.valid), p.questions[0])


@dataclass
class RoundStats:
    """Counts over every question proposed in one step, all rounds together."""

    rounds: int = 0
    total: int = 0
    valid: int = 0
    learnable: int = 0
    first_total: int = 0
    first_learnable: int = 0
    dim_scores: dict[str, list[float]] = field(default_factory=dict)
    format_scores: list[float] = field(default_factory=list)
    questions: list[tuple[str, bool, dict[str, float]]] = field(
        default_factory=list
    )  # valid: text, learnable, difficulty
    subjects: list[tuple[str, bool]] = field(default_factory=list)  # valid, with meta["subject"]: it, learnable

    def add_round(self, records: list[QuestionRecord], first: bool, task: SelfPlayTask) -> None:
        self.rounds += 1
        self.questions += [(q.parsed.question.text, q.learnable, task.difficulty(q.parsed.question))
                           for q in records if q.parsed.valid]  # fmt: skip
        self.subjects += [(q.parsed.question.meta["subject"], q.learnable)
                          for q in records if q.parsed.valid and "subject" in q.parsed.question.meta]  # fmt: skip
        self.total += len(records)
        self.valid += sum(q.parsed.valid for q in records)
        self.learnable += sum(q.learnable for q in records)
        if first:
            self.first_total, self.first_learnable = len(records), sum(q.learnable for q in records)
        for q in records:
            if q.scored is not None:
                for d, values in q.scored.scores.items():
                    self.dim_scores.setdefault(d, []).extend(values)
                self.format_scores.extend(q.scored.format)

    def metrics(self, task: str, prompts, samples: list[TrainingSample], num_solver: int, p_rewards) -> dict:
        proposer = [s for s in samples if s.role == "proposer"]
        solver = samples[:num_solver]
        m = {
            "unified_filter/num_learnable": float(self.learnable),
            "unified_filter/num_total": float(self.total),
            "unified_filter/learnable_ratio": self.learnable / max(1, self.total),
            "unified_filter/num_sampled": float(sum(p.sampled >= 0 for p in prompts)),
            "proposer/num_trajectories": float(self.total),
            "proposer/num_integrated": float(len(proposer)),
            "proposer/reward_mean": sum(s.reward for s in proposer) / max(1, len(proposer)),
            "joint/combined_reward_mean": sum(s.reward for s in solver) / max(1, len(solver)),
            "joint/proposer_solver_ratio": len(proposer) / max(1, len(solver)),
            "repropose/total_attempts": float(sum(p.attempts for p in prompts)),
            "repropose/rounds": float(self.rounds),
            "repropose/final_non_learnable": float(sum(p.sampled < 0 for p in prompts)),
            f"selfplay/{task}/valid_ratio": self.valid / max(1, self.total),
            f"selfplay/{task}/first_round_learnable_ratio": self.first_learnable / max(1, self.first_total),
            f"selfplay/{task}/prompt_proposer_reward_mean": sum(p_rewards) / max(1, len(p_rewards)),
            f"selfplay/{task}/format_mean": sum(self.format_scores) / max(1, len(self.format_scores)),
        }
        for d, values in self.dim_scores.items():
            m[f"selfplay/{task}/score_{d}_mean"] = sum(values) / max(1, len(values))
        m.update(self.curriculum_metrics(task))
        return m

    def curriculum_metrics(self, task: str) -> dict[str, float]:
        """Where the proposer's questions are: the mean difficulty of the valid proposals and of the
        learnable ones, and their diversity (unique fraction, entropy in bits of the question texts; for tasks
        whose questions name a subject, e.g. the search task's person, the unique fraction of subjects)."""
        if not self.questions:
            return {}
        texts = [text for text, _, _ in self.questions]
        counts = Counter(texts)
        n = len(texts)
        m = {
            f"selfplay/{task}/proposal_unique_frac": len(counts) / n,
            f"selfplay/{task}/proposal_entropy": -sum(c / n * math.log2(c / n) for c in counts.values()),
        }
        for kind, chosen in (("proposed", self.questions), ("learnable", [q for q in self.questions if q[1]])):
            for name in dict.fromkeys(k for _, _, d in self.questions for k in d):
                values = [d[name] for _, _, d in chosen if name in d]
                if values:
                    m[f"selfplay/{task}/{kind}_{name}_mean"] = sum(values) / len(values)
        for kind, chosen in (("proposed", self.subjects), ("learnable", [s for s in self.subjects if s[1]])):
            if chosen:
                m[f"selfplay/{task}/{kind}_subject_unique_frac"] = len({s for s, _ in chosen}) / len(chosen)
        return m
