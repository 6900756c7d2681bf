"""reinforce_pro in TRL: a GRPOTrainer whose vllm_importance_sampling_mode gains two prefix modes.

    from trl import GRPOConfig
    from reinforce_pro.integrations.trl import GRPOTrainer   # instead of trl's

    args = GRPOConfig(..., use_vllm=True, vllm_importance_sampling_mode="prefix_mask",
                      vllm_importance_sampling_clip_min=0.5, vllm_importance_sampling_clip_max=5.0)
    GRPOTrainer(model=..., reward_funcs=..., args=args, train_dataset=...).train()

| mode            | weight of token t (band [C_min, C_max])                             | this project's name |
|-----------------|---------------------------------------------------------------------|---------------------|
| prefix_mask     | rho_t while the geometric mean of rho over t's prefix is in the band, else 0 | reinforce_pro |
| prefix_truncate | clamp(rho_t, C_min, C_max) where prefix_mask keeps, else 0          | reinforce_pro-tis   |

TRL's own modes (token_/sequence_ x truncate/mask) are TRL's code, untouched. For a prefix mode, TRL computes the
old and sampling log-probs as usual (its generation step runs with token_mask so nothing else changes), and the
ratio it multiplies into the per-token loss is replaced by `algos.is_correction.compute_is_weights`: the function
this project's trainer uses. C_min None is 0, C_max None is no upper bound. The mask is TRL's completion mask
times its tool mask (tool-result tokens never move the running mean).

What differs from TRL's modes: a token whose sampling log-prob is NaN (vLLM gave none) gets weight 0 and ends the
prefix (TRL treats it as ratio 1); TRL's `sampling/importance_sampling_ratio/*` metrics describe the raw token
ratios in the band, and the correction's own metrics are logged beside them as `is/*`.
"""

from __future__ import annotations

import math

import torch

from reinforce_pro.algos.is_correction import compute_is_weights
from reinforce_pro.integrations.releases import installed_release

SUPPORTED = ("1.16.0",)
installed_release("trl", SUPPORTED)  # one line (UnsupportedRelease) on another release, before TRL's own import

import trl  # noqa: E402

PREFIX_MODES = {"prefix_mask": "reinforce_pro", "prefix_truncate": "reinforce_pro-tis"}
# Token- or sequence-weighted means: merged over processes as sum(value * weight) / sum(weight).
LOGGED = ("is/token_masked_frac", "is/seq_masked_frac", "is/weight_mean", "is/vllm_kl", "is/prefix_is_mean")


class GRPOTrainer(trl.GRPOTrainer):
    """TRL's GRPOTrainer; `vllm_importance_sampling_mode` also takes `prefix_mask` and `prefix_truncate`."""

    def _generate_and_score_completions(self, inputs):
        mode = self.vllm_importance_sampling_mode
        if mode not in PREFIX_MODES or not (self.use_vllm and self.vllm_importance_sampling_correction):
            return super()._generate_and_score_completions(inputs)
        self.vllm_importance_sampling_mode = "token_mask"  # TRL's own ratio, replaced below
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self.vllm_importance_sampling_mode = mode
        output["importance_sampling_ratio"] = self.prefix_is_weights(output)
        return output

    def prefix_is_weights(self, output: dict) -> torch.Tensor:
        """The (B, T) weights of the prefix mode for one generation batch (`output` of TRL's generation step:
        old_per_token_logps, sampling_per_token_logps, completion_mask, optional tool_mask); logs `is/*`."""
        mask = output["completion_mask"]
        if "tool_mask" in output:
            mask = mask * output["tool_mask"]
        low = self.vllm_importance_sampling_clip_min
        high = self.vllm_importance_sampling_clip_max
        weights, metrics = compute_is_weights(
            PREFIX_MODES[self.vllm_importance_sampling_mode],
            output["old_per_token_logps"],
            output["sampling_per_token_logps"],
            mask,
            0.0 if low is None else low,
            math.inf if high is None else high,
        )
        split = "train" if self.model.training else "eval"
        for key in LOGGED:
            stat = metrics[key]  # weighted over this process's tokens, then over every process's
            total = self.accelerator.gather(torch.stack([stat.value * stat.weight, stat.weight.to(stat.value)]))
            total = total.view(-1, 2).sum(0)
            self._metrics[split][key].append((total[0] / total[1].clamp(min=1)).item())
        return weights.to(output["old_per_token_logps"].dtype)
