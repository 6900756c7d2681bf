"""On-policy distillation: the student samples, a frozen teacher scores every sampled token, and the per-token
reverse KL is the reward (docs/distillation.md).

For a response y sampled from the student S, the teacher T's and the student's log-probs of each sampled token
give log r_t = log T(y_t | y_<t) - log S(y_t | y_<t). The distillation advantage of token t is

    A_t = opd_kl_coef * log r_t          (the negative k1 estimate of KL(S || T) at that token)

added to the task's advantage scaled by opd_task_coef (0: pure distillation). The policy-gradient loss with
this advantage has the reverse-KL gradient in expectation: E_{y~S}[-(log S(y) - log T(y)) grad log S(y)] =
-grad KL(S || T), because E_{y~S}[grad log S(y)] = 0 (tests/test_distill.py checks it by enumeration). The
advantage is per token and undiscounted (the Tinker recipe's, slime's and prime-rl's choice): a token is credited
for its own disagreement with the teacher, not for the rest of the response's. --opd.kl_estimator picks which
estimate opd/reverse_kl reports (OpenRLHF's meaning); all three are logged, and the gradient is always k1's.

Which student log-probs enter log r_t is --opd_student_logprobs: `trainer` (the policy's old log-probs, the
default) or `engine` (the log-probs vLLM sampled with). The engine's differ from the trainer's by the rollout /
training mismatch, which then enters the reward itself, not only the importance ratio that the IS corrections
fix; `trainer` keeps it out of the reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reinforce_pro.algos.is_correction import position_buckets
from reinforce_pro.algos.kl import KL_ESTIMATORS
from reinforce_pro.algos.masked import masked_mean
from reinforce_pro.flagspec import flag

STUDENT_LOGPROBS = ("trainer", "engine")
TEACHER_BACKENDS = ("actor", "engine")


@dataclass(frozen=True)
class DistillConfig:
    """A teacher and how its log-probs become the reward. A run distils when `teacher_pretrain` is set."""

    # fmt: off
    teacher_pretrain: str | None = flag(None,
        "HF model dir of a frozen teacher that scores every sampled token: on-policy distillation (docs/"
        "distillation.md). Its tokenizer must be the policy's. builtin: the embedded default's teacher (a larger "
        "tiny model trained to high accuracy on --builtin_task, made once and cached)",
        dotted="teacher.model_name_or_path", group="distill")
    opd_kl_coef: float = flag(1.0,
        "[reinforce_pro] weight of the distillation advantage, teacher log-prob - student log-prob of each sampled "
        "token (slime's --opd-kl-coef, prime-rl's teacher_tau)", at_least=0, finite=True, group="distill")
    opd_task_coef: float = flag(1.0,
        "[reinforce_pro] weight of the task reward's advantage beside it (prime-rl's adv_tau); 0: pure distillation. "
        "With --prompt_data and no reward function the task reward is 0", at_least=0, finite=True, group="distill")
    opd_kl_estimator: str = flag("k3",
        "which estimate of KL(student || teacher) opd/reverse_kl reports (OpenRLHF's meaning: all three are logged "
        "as opd/reverse_kl_k1/k2/k3; the gradient is always the sampled-token k1 score-function estimator)",
        dotted="opd.kl_estimator", choices=tuple(KL_ESTIMATORS), group="distill")
    opd_topk: int = flag(0,
        "0: the reverse KL of the sampled token (the only mode built); K > 0, a top-K reverse KL over the "
        "student's K most likely tokens, is refused", dotted="opd.topk", at_least=0, group="distill")
    opd_kd_temperature: float = flag(1.0, "the teacher's logits are divided by this before its log-softmax",
        dotted="opd.kd_temperature", above=0, finite=True, group="distill")
    opd_student_logprobs: str = flag("trainer",
        "[reinforce_pro] the student's log-probs in the reward: trainer (the policy's old log-probs, the default) or "
        "engine (those vLLM sampled with, which carry the rollout/training mismatch into the reward)",
        choices=STUDENT_LOGPROBS, group="distill")
    teacher_backend: str = flag("actor",
        "[reinforce_pro] what serves the teacher: actor (an HF model in an actor group placed like the reference, in "
        "--param_dtype) or engine (vLLM engines that only prefill, in the same dtype; --opd.kd_temperature must be 1)",
        choices=TEACHER_BACKENDS, group="distill")
    teacher_num_engines: int = flag(1, "[reinforce_pro] with --teacher_backend engine: how many teacher engines",
        at_least=1, group="distill")
    # fmt: on


def distill_advantages(teacher_lp: torch.Tensor, student_lp: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) float32 log T(y_t) - log S(y_t) on the action tokens, 0 elsewhere and where either is not finite
    (an engine's -inf, a teacher's NaN: that token then carries no distillation signal, and distill_metrics counts
    it)."""
    diff = teacher_lp.float() - student_lp.float()
    keep = action_mask.bool() & torch.isfinite(diff)
    return torch.where(keep, diff, 0.0)


def distill_metrics(
    teacher_lp: torch.Tensor, student_lp: torch.Tensor, action_mask: torch.Tensor, estimator: str
) -> dict[str, float]:
    """opd/*: the reverse KL(student || teacher) by each estimator (means over the action tokens), the one
    --opd.kl_estimator picks as opd/reverse_kl, both sides' mean log-probs, the share of tokens dropped for a
    non-finite log-prob, and the per-position reverse KL (k1) for the drift picture (opd_pos/reverse_kl/<bucket>)."""
    diff = teacher_lp.float() - student_lp.float()
    action = action_mask.bool()
    finite = action & torch.isfinite(diff)
    log_ratio = torch.where(finite, -diff, 0.0).double()  # log S - log T; float64: k3's exp of a large gap stays finite
    m: dict[str, float] = {}
    for name, estimate in KL_ESTIMATORS.items():  # unclamped (the KL penalty's clamp would hide a far teacher)
        m[f"opd/reverse_kl_{name}"] = float(masked_mean(estimate(log_ratio), finite))
    m["opd/reverse_kl"] = m[f"opd/reverse_kl_{estimator}"]
    m["opd/teacher_logprob_mean"] = float(masked_mean(torch.where(finite, teacher_lp.float(), 0.0), finite))
    m["opd/student_logprob_mean"] = float(masked_mean(torch.where(finite, student_lp.float(), 0.0), finite))
    m["opd/nonfinite_frac"] = float((action & ~finite).sum() / action.sum().clamp(min=1))
    if action.size(-1):
        bucket, names = position_buckets(action)
        neg = torch.where(finite, -diff, 0.0)
        for b, name in enumerate(names):
            m[f"opd_pos/reverse_kl/{name}"] = float(masked_mean(neg, finite & (bucket == b)))
    return m
