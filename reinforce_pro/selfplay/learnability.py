"""Steps 5, 6, 9 and 10 of the self-play step as pure functions: no Ray, no model, no tensors.

A question is *learnable* when, for every scored dimension d, the fraction of its solver responses whose
score reaches `threshold_d` lies within [min_ratio_d, max_ratio_d]: the solver sometimes succeeds and
sometimes fails, so its group of responses carries a learning signal (Absolute Zero, Zhao et al. 2025,
rewards the proposer for exactly this middle ground). A prompt whose questions are all learnable, or none
is, gives no contrast between questions and is re-proposed.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence

# Proposer rewards of the reference design.
LEARNABLE_REWARD = 1.0
NOT_LEARNABLE_REWARD = 0.0
UNRESOLVED_REWARD = -0.5

Thresholds = Mapping[str, tuple[float, float, float]]  # dimension -> (threshold, min_ratio, max_ratio)


def pass_ratio(scores: Sequence[float], threshold: float) -> float:
    """Fraction of `scores` that reach `threshold` (0.0 for no scores)."""
    return sum(1 for s in scores if s >= threshold) / len(scores) if scores else 0.0


def is_learnable(scores: Mapping[str, Sequence[float]], thresholds: Thresholds) -> bool:
    """True when every dimension of `thresholds` has a pass ratio within [min_ratio, max_ratio].

    scores: dimension -> one score per solver response of the question. A dimension of `thresholds`
    missing from `scores`, or with no responses, makes the question not learnable.
    """
    for dim, (threshold, low, high) in thresholds.items():
        values = scores.get(dim)
        if not values:
            return False
        if not low <= pass_ratio(values, threshold) <= high:
            return False
    return True


def plan_question_sampling(learnable_by_prompt: Sequence[Sequence[bool]], rng: random.Random) -> list[int]:
    """For each prompt's question group: a uniformly drawn learnable question's index, or -1 (re-propose)
    when all of the group's questions are learnable or none is (an empty group counts as none)."""
    plan = []
    for row in learnable_by_prompt:
        learnable = [i for i, ok in enumerate(row) if ok]
        plan.append(rng.choice(learnable) if 0 < len(learnable) < len(row) else -1)
    return plan


def proposer_reward(sampled_index: int, learnable_by_prompt_row: Sequence[bool], unresolved: bool) -> float:
    """The reward of a prompt's proposer trajectory: -0.5 when the prompt is still marked for re-proposal
    after the last attempt; else 1.0 when the sampled question is learnable, 0.0 when not."""
    if unresolved or sampled_index < 0:
        return UNRESOLVED_REWARD
    return LEARNABLE_REWARD if learnable_by_prompt_row[sampled_index] else NOT_LEARNABLE_REWARD


def question_reward(valid: bool, learnable: bool, format_penalty: float, learnable_reward: float = 1.0) -> float:
    """Per-question proposer reward of `--proposer_train_scope group`: the format penalty for an invalid
    question, else `learnable_reward` when learnable (1.0, or 1 - solve rate: `graded_reward`) and 0.0 when
    not."""
    if not valid:
        return format_penalty
    return learnable_reward if learnable else NOT_LEARNABLE_REWARD


# --proposer_reward: what a learnable question earns its proposer
PROPOSER_REWARDS = ("learnable", "difficulty")


def graded_reward(scores: Mapping[str, Sequence[float]], thresholds: Thresholds, kind: str) -> float:
    """The reward of a learnable question. `learnable`: 1.0 for any. `difficulty` (Absolute Zero's
    r_propose = 1 - the solver's mean success): 1 minus the mean over dimensions of the pass ratio, so a
    question the solver gets 1 in 8 times earns 0.875 and one it gets 7 in 8 times 0.125, and the proposer is
    pushed toward the hard edge of what the solver can do rather than anywhere inside it."""
    if kind == "learnable":
        return LEARNABLE_REWARD
    ratios = [pass_ratio(scores[d], threshold) for d, (threshold, _, _) in thresholds.items()]
    return 1.0 - sum(ratios) / len(ratios)


def repetition_penalties(texts: Sequence[str], coef: float) -> dict[str, float]:
    """R-Zero's repetition penalty (Huang et al. 2025), with clusters of identical question text: a question
    proposed k times among the step's n valid proposals costs coef * k / n of its proposer reward, so a
    proposer that collapses onto a few questions earns less than one that spreads over many."""
    counts = Counter(texts)
    return {text: coef * k / len(texts) for text, k in counts.items()}


def solver_reward(scores: Mapping[str, float], weights: Mapping[str, float], format_reward: float, format_coef: float):
    """sum_d weight_d * score_d + format_coef * format_reward, for one response."""
    return sum(weights[d] * scores[d] for d in weights) + format_coef * format_reward


def combined_reward(solver: float, proposer: float, proposer_coef: float) -> float:
    """The reward of a solver sample: its solver reward plus proposer_coef times its prompt's proposer reward."""
    return solver + proposer_coef * proposer
