"""Load a reward-function file (`--remote_rm_url path/to/file.py`) and normalise what it returns.

The contract is OpenRLHF's: the file defines `reward_func(queries, prompts, labels)` where `queries`
are prompt + response texts, and returns either a tensor (or list) of one reward per query, or a dict
with `rewards` (used for the advantages), optionally `scores` (logged; used by dynamic filtering) and
`extra_logs` (a dict of per-query values, logged as `reward/<key>`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from reinforce_pro.userfile import import_user_file


class RewardFileError(ValueError):
    """A reward file that cannot be used; the message names the file and the problem."""


@dataclass
class RewardOutput:
    rewards: torch.Tensor  # (N,) float32
    scores: torch.Tensor  # (N,) float32, equal to rewards when the function gives none
    extra_logs: dict[str, torch.Tensor] = field(default_factory=dict)  # each (N,)


def load_reward_func(path: str | Path) -> Callable:
    module = import_user_file(path, "--remote_rm_url", RewardFileError, "reward_func")
    func = getattr(module, "reward_func", None)
    if not callable(func):
        raise RewardFileError(f"--remote_rm_url {path}: defines no callable reward_func(queries, prompts, labels)")
    return func


SHOWN = 3  # offending values quoted in an error: enough to recognise the bug, short enough for one line


def _as_tensor(value, n: int, what: str, finite: bool = True) -> torch.Tensor:
    try:
        t = torch.as_tensor(value, dtype=torch.float32).flatten()
    except (TypeError, ValueError, RuntimeError) as e:
        sample = list(value)[:SHOWN] if isinstance(value, list | tuple) else type(value).__name__
        raise RewardFileError(f"reward_func returned {what} that are not numbers ({sample!r}: {e})") from None
    if t.numel() != n:
        raise RewardFileError(f"reward_func returned {t.numel()} {what} for {n} queries")
    bad = (~torch.isfinite(t)).nonzero().flatten()
    if finite and len(bad):
        first = ", ".join(f"[{i}]={t[i].item()}" for i in bad[:SHOWN].tolist())
        raise RewardFileError(f"reward_func returned non-finite {what} at {len(bad)} of {n} queries: {first}")
    return t


NAN_POLICIES = ("error", "zero", "drop")
NONFINITE_KEY = "nonfinite"  # extra_logs key (logged as reward/nonfinite) marking rows whose reward was not finite


def normalize_reward_output(out, n: int, nan_policy: str = "error") -> RewardOutput:
    """Accept a tensor / list, or a dict with rewards, scores, extra_logs. Non-finite rewards or scores are
    an error under nan_policy "error"; under "zero" or "drop" they become 0 and extra_logs["nonfinite"]
    marks their rows (1.0), which "drop" then leaves out of the loss (ExperienceBuilder.make_experience). An
    extra_logs entry with non-finite values is only logged, so it is dropped with a warning."""
    finite = nan_policy == "error"
    if isinstance(out, dict):
        if "rewards" not in out:
            raise RewardFileError(f"reward_func returned a dict without 'rewards' (keys: {sorted(out)})")
        rewards = _as_tensor(out["rewards"], n, "rewards", finite)
        scores = _as_tensor(out["scores"], n, "scores", finite) if out.get("scores") is not None else rewards.clone()
        extra = {}
        for k, v in (out.get("extra_logs") or {}).items():
            t = _as_tensor(v, n, f"extra_logs[{k!r}]", finite=False)
            if torch.isfinite(t).all():
                extra[k] = t
            elif k not in _warned:
                _warned.add(k)
                print(f"[warning] reward_func extra_logs[{k!r}] has non-finite values: not logged", flush=True)
        return _replace_nonfinite(RewardOutput(rewards, scores, extra), finite)
    rewards = _as_tensor(out, n, "rewards", finite)
    return _replace_nonfinite(RewardOutput(rewards, rewards.clone()), finite)


def _replace_nonfinite(out: RewardOutput, finite: bool) -> RewardOutput:
    if finite:
        return out
    bad = ~(torch.isfinite(out.rewards) & torch.isfinite(out.scores))
    out.rewards[bad], out.scores[bad] = 0.0, 0.0
    out.extra_logs[NONFINITE_KEY] = bad.float()
    return out


_warned: set[str] = set()  # extra_logs keys already warned about (once per key and process)
