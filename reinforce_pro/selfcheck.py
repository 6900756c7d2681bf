"""Algorithm self-check: `python -m reinforce_pro.selfcheck`.

Simulates a rollout/trainer mismatch that grows along the response (the case reinforce_pro is built
for), runs every IS correction through the real PolicyLoss, prints what each one keeps and checks the
invariants the trainer relies on. Exits 1 if any check fails. Takes a second on a CPU.
"""

from __future__ import annotations

import sys

import torch

from reinforce_pro.algos.is_correction import IS_CORRECTIONS, default_band
from reinforce_pro.algos.losses import DEFAULT_IS_THRESHOLD, PolicyLoss


def drifting_batch(b: int = 64, t: int = 256, seed: int = 0):
    """Old and rollout log-probs whose log ratio has a drift that grows with position and a few spikes."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen) * 2 - 0.1
    drift = torch.linspace(0, 1, t) * torch.rand(b, 1, generator=gen) * 3.0  # up to exp(3) = 20x late
    noise = 0.05 * torch.randn(b, t, generator=gen)
    spikes = (torch.rand(b, t, generator=gen) < 0.01) * 3.0
    rollout = old - drift - noise - spikes
    lengths = torch.randint(t // 2, t + 1, (b,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    log_probs = old + 0.02 * torch.randn(b, t, generator=gen)
    advantages = torch.randn(b, 1, generator=gen).expand(b, t)
    return log_probs, old, rollout, advantages, mask


def run() -> list[str]:
    log_probs, old, rollout, adv, mask = drifting_batch()
    failures = []
    print(f"{'correction':<17} {'masked':>7} {'seq_masked':>10} {'ess':>6} {'1st_masked':>10} {'loss':>9}")
    for name in IS_CORRECTIONS:
        band = default_band(name, DEFAULT_IS_THRESHOLD)
        loss_fn = PolicyLoss(
            enable_vllm_is_correction=True, vllm_is_correction_type=name, vllm_is_truncated_threshold=band
        )
        lp = log_probs.clone().requires_grad_(True)
        loss, m = loss_fn(lp, old, adv, action_mask=mask, rollout_log_probs=rollout)
        loss.backward()
        print(
            f"{name:<17} {float(m['is/token_masked_frac']):>7.3f} {float(m['is/seq_masked_frac']):>10.3f} "
            f"{float(m['is/ess']):>6.3f} {float(m['is/first_masked_pos_mean']):>10.1f} {loss.item():>9.4f}"
        )
        if not (torch.isfinite(loss) and torch.isfinite(lp.grad).all()):
            failures.append(f"{name}: non-finite loss or gradient")
        if (lp.grad[~mask] != 0).any():
            failures.append(f"{name}: gradient on masked tokens")
        on_policy, _ = loss_fn(log_probs, old, adv, action_mask=mask, rollout_log_probs=old)
        plain, _ = PolicyLoss()(log_probs, old, adv, action_mask=mask)
        if not torch.allclose(on_policy, plain, atol=1e-6):
            failures.append(f"{name}: with rollout == old the loss differs from the uncorrected one")
    return failures


def main() -> int:
    print("reinforce_pro algorithm self-check: PolicyLoss under a progressive rollout/trainer drift\n")
    failures = run()
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nall checks passed: finite losses and gradients, zero gradient under the mask, on-policy == uncorrected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
