"""The pure-torch algorithm core: nothing here imports ray, deepspeed, vllm or transformers.

Each choice of the command line maps to one table of same-signature functions:
`IS_CORRECTIONS` (--vllm_is_correction_type), `POLICY_LOSSES` (--policy_loss_type),
`ADVANTAGE_ESTIMATORS` (--advantage_estimator), `KL_ESTIMATORS` (--kl_estimator).
"""

from reinforce_pro.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs, compute_advantages
from reinforce_pro.algos.is_correction import IS_CORRECTIONS, compute_is_weights
from reinforce_pro.algos.kl import KL_ESTIMATORS, build_kl_controller, compute_approx_kl, kl_loss
from reinforce_pro.algos.losses import POLICY_LOSSES, PolicyLoss, ValueLoss
from reinforce_pro.algos.masked import aggregate_loss, masked_mean, masked_sum

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "IS_CORRECTIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageInputs",
    "PolicyLoss",
    "ValueLoss",
    "aggregate_loss",
    "build_kl_controller",
    "compute_advantages",
    "compute_approx_kl",
    "compute_is_weights",
    "kl_loss",
    "masked_mean",
    "masked_sum",
]
