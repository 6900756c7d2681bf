"""reinforce_pro in an unmodified OpenRLHF install: OpenRLHF's own train_ppo_ray, with the choice registered.

    python -m reinforce_pro.integrations.openrlhf <OpenRLHF's train_ppo_ray flags>

    # OpenRLHF 0.9.10: one more --vllm_is_correction_type
    ... --enable_vllm_is_correction --vllm_is_correction_type reinforce_pro --vllm_is_truncated_threshold 0.5 5.0
    # OpenRLHF 0.11.2: one more --algo.advantage.is_correction_level (mode mask: reinforce_pro; clip: reinforce_pro-tis)
    ... --algo.advantage.is_correction_level prefix --algo.advantage.is_correction_threshold 0.5 5.0

The launcher runs `openrlhf.cli.train_ppo_ray` as `__main__` after two changes, both made at run time:
- the flag's `choices=` gains the new value (argparse, in this process only);
- OpenRLHF's `PolicyLoss` becomes a subclass that computes the loss with this project's `algos.PolicyLoss` when
  the new value is selected, and is OpenRLHF's own class, untouched, for every other choice. OpenRLHF builds its
  loss inside Ray actors, so the launcher adds a `worker_process_setup_hook` to OpenRLHF's `ray.init`: every worker
  registers the subclass when (and only if) it imports `openrlhf.models.loss`. With `ray job submit`, run the
  launcher as the entrypoint; reinforce_pro must be installed on every node, as OpenRLHF is.
For a fork: `python -m reinforce_pro.integrations.openrlhf patch 0.9.10 | git apply` in the OpenRLHF checkout.

What differs from OpenRLHF's own types: a token whose old or rollout log-prob is NaN/inf gets weight 0 (OpenRLHF
would multiply by it); the logged ppo_kl is the policy's (OpenRLHF 0.9.10 logs the rollout mismatch under that
name once IS is on); the `is/*` metrics of the last call are on the loss module (`last_metrics`), OpenRLHF logs
only its own vllm_kl (and, 0.11.2, is_filter_ratio).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from reinforce_pro.integrations.releases import UnsupportedRelease, after_import, installed_release, run_trainer

LOSS_MODULE = "openrlhf.models.loss"
# Modules that bind PolicyLoss by name (`from openrlhf.models import PolicyLoss`): re-pointed if imported first.
LOSS_USERS = ("openrlhf.models", "openrlhf.trainer.ray.ppo_actor")
WORKER_HOOK = "reinforce_pro.integrations.openrlhf.register"
PATCHES = Path(__file__).with_name("patches")  # openrlhf-<release>.patch, shipped in the package


# ------------------------------------------------------------------------------------------ the loss, per release
def _settings(loss, correction: str, threshold):
    """This project's PolicyLoss with OpenRLHF's loss settings and `correction` on."""
    from reinforce_pro.algos.losses import PolicyLoss, SurrogateConfig

    return PolicyLoss(
        SurrogateConfig(
            clip_eps_low=loss.clip_eps_low,
            clip_eps_high=loss.clip_eps_high,
            dual_clip=loss.dual_clip,
            token_level_loss=loss.token_level_loss,
            policy_loss_type=loss.policy_loss_type,
            enable_vllm_is_correction=True,
            vllm_is_truncated_threshold=tuple(threshold),
            vllm_is_correction_type=correction,
        )
    )


def _loss_0_9(base: type) -> type:
    """OpenRLHF 0.9.10's PolicyLoss(vllm_is_correction_type=...) with `reinforce_pro` added."""

    class PolicyLoss(base):
        def __init__(self, *args, vllm_is_correction_type: str = "tis", **kwargs) -> None:
            ours = vllm_is_correction_type == "reinforce_pro"
            super().__init__(*args, vllm_is_correction_type="tis" if ours else vllm_is_correction_type, **kwargs)
            self.vllm_is_correction_type = vllm_is_correction_type
            self.reinforce_pro = None
            if ours and self.enable_vllm_is_correction:
                self.reinforce_pro = _settings(self, "reinforce_pro", self.vllm_is_truncated_threshold)
            self.last_metrics = {}

        def forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
            if self.reinforce_pro is None:
                return super().forward(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs)
            loss, m = self.reinforce_pro(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs)
            self.last_metrics = m
            return loss, m["policy/clip_frac"].value, m["policy/ppo_kl"].value, m["is/vllm_kl"].value

    return PolicyLoss


def _loss_0_11(base: type) -> type:
    """OpenRLHF 0.11.2's PolicyLoss(is_correction_level / _mode / _gating / _threshold) with level `prefix`: the
    gate reads the running geometric mean of the ratio (mode mask: reinforce_pro; clip: reinforce_pro-tis)."""

    class PolicyLoss(base):
        def __init__(
            self,
            *args,
            is_correction_level: str = "off",
            is_correction_mode: str = "mask",
            is_correction_gating: str = "ratio",
            is_correction_threshold=(0.5, 5.0),
            **kwargs,
        ) -> None:
            ours = is_correction_level == "prefix"
            if ours and is_correction_gating != "ratio":
                raise ValueError(
                    "is_correction_level=prefix gates the running geometric mean of the ratio: "
                    f"is_correction_gating must be ratio, got {is_correction_gating}"
                )
            super().__init__(
                *args,
                is_correction_level="token" if ours else is_correction_level,
                is_correction_mode="mask" if ours else is_correction_mode,
                is_correction_gating=is_correction_gating,
                is_correction_threshold=is_correction_threshold,
                **kwargs,
            )
            self.is_correction_level, self.is_correction_mode = is_correction_level, is_correction_mode
            self.reinforce_pro = None
            if ours:
                correction = "reinforce_pro" if is_correction_mode == "mask" else "reinforce_pro-tis"
                self.reinforce_pro = _settings(self, correction, is_correction_threshold)
            self.last_metrics = {}

        def forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None, **batch):
            if self.reinforce_pro is None:
                return super().forward(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs, **batch)
            loss, m = self.reinforce_pro(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs, **batch)
            self.last_metrics = m
            return (loss, m["policy/clip_frac"].value, m["policy/ppo_kl"].value, m["is/vllm_kl"].value,
                    m["is/token_masked_frac"].value)  # fmt: skip

    return PolicyLoss


@dataclass(frozen=True)
class Release:
    flag: str  # the train_ppo_ray option whose choices gain `choice`
    choice: str
    loss: Callable[[type], type]  # OpenRLHF's PolicyLoss -> its subclass that knows `choice`


RELEASES = {
    "0.9.10": Release("--vllm_is_correction_type", "reinforce_pro", _loss_0_9),
    "0.11.2": Release("--algo.advantage.is_correction_level", "prefix", _loss_0_11),
}


# ------------------------------------------------------------------------------------------ registration
def register() -> None:
    """Make OpenRLHF's PolicyLoss know the new choice in this process, when `openrlhf.models.loss` is imported
    (now if it already is). Idempotent. The launcher calls it in the driver; Ray calls it in every worker."""
    release = RELEASES[installed_release("openrlhf", RELEASES)]
    after_import(LOSS_MODULE, functools.partial(_patch_loss, release))


def _patch_loss(release: Release, loss_module: ModuleType) -> None:
    base = loss_module.PolicyLoss
    if getattr(base, "reinforce_pro_registered", False):
        return
    cls = release.loss(base)
    cls.__module__, cls.__qualname__, cls.reinforce_pro_registered = base.__module__, base.__qualname__, True
    loss_module.PolicyLoss = cls
    for name in LOSS_USERS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "PolicyLoss", None) is base:
            module.PolicyLoss = cls


def _with_choice(add_argument: Callable, release: Release) -> Callable:
    """argparse's add_argument, which gives `release.flag` one more choice."""

    @functools.wraps(add_argument)
    def wrapped(self, *names, **kwargs):
        if release.flag in names and "choices" in kwargs:
            kwargs["choices"] = [*kwargs["choices"], release.choice]
        return add_argument(self, *names, **kwargs)

    return wrapped


def patch_text(release: str) -> str:
    """The `git apply`-able patch that adds the choice to an OpenRLHF checkout (or install) of `release`."""
    if release not in RELEASES:
        raise UnsupportedRelease(f"no patch for OpenRLHF {release}; patches: {', '.join(RELEASES)}")
    return (PATCHES / f"openrlhf-{release}.patch").read_text()


def main(argv: list[str] | None = None) -> int:
    """Run OpenRLHF's train_ppo_ray with `argv`, the new choice registered; `patch RELEASE` prints the patch."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["patch"]:
        if len(argv) != 2:
            print(f"usage: python -m {__name__} patch {{{','.join(RELEASES)}}} | git apply", file=sys.stderr)
            return 2
        try:
            sys.stdout.write(patch_text(argv[1]))
        except UnsupportedRelease as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        release = RELEASES[installed_release("openrlhf", RELEASES)]
    except UnsupportedRelease as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    argparse.ArgumentParser.add_argument = _with_choice(argparse.ArgumentParser.add_argument, release)
    run_trainer("openrlhf.cli.train_ppo_ray", argv, register, WORKER_HOOK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
