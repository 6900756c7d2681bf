"""reinforce_pro inside OpenRLHF and TRL, tested against their own code at the supported releases.

The releases are installed by `INTEGRATIONS=1 scripts/setup_env.sh` (scripts/test.sh sets it) into
.venv/integrations/<name>-<version>, each put on the PYTHONPATH of a subprocess: the trainer's code never enters
this test process. Losses are compared in float64 at 1e-12 (the same operations in another order); OpenRLHF's
clip fraction is float32 (its `.float()`), compared at 1e-7.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = Path(sys.prefix) / "integrations"
CHECKS = ROOT / "tests" / "integration_checks.py"
PATCHES = ROOT / "reinforce_pro" / "integrations" / "patches"
OPENRLHF = ["0.9.10", "0.11.2"]
OURS = {"0.9.10": ["reinforce_pro"], "0.11.2": ["prefix-mask", "prefix-clip"]}
OWN = {"0.9.10": ["tis", "icepop", "seq-mask-tis"], "0.11.2": ["token-mask", "token-clip", "seq-mask"]}
RAW_RATIO = {"0.9.10": "icepop", "0.11.2": "token-mask"}  # OpenRLHF's own type that weighs by the raw ratio


def installed(name: str) -> Path:
    path = INSTALLED / name
    if not path.is_dir():
        pytest.skip(f"{name} is not installed: run INTEGRATIONS=1 bash scripts/setup_env.sh")
    return path


def run_python(pythonpath: list[Path], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [*pythonpath, ROOT]))}
    result = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def checks(pythonpath: Path, release: str, how: str) -> dict[str, list[float]]:
    result = run_python([pythonpath], str(CHECKS), "openrlhf", release, how)
    return json.loads(result.stdout.strip().splitlines()[-1])  # DeepSpeed prints its accelerator line first


def assert_same(a: list[float], b: list[float]) -> None:
    loss_a, clip_a, grad_a = a
    loss_b, clip_b, grad_b = b
    assert loss_a == pytest.approx(loss_b, rel=1e-12, abs=1e-12)
    assert clip_a == pytest.approx(clip_b, abs=1e-7)
    assert grad_a == pytest.approx(grad_b, rel=1e-12, abs=1e-12)


@pytest.fixture(scope="module", params=OPENRLHF)
def openrlhf(request, tmp_path_factory):
    """Per release: the launcher's numbers (registered in an unmodified install) and the patched copy's."""
    release = request.param
    site = installed(f"openrlhf-{release}")
    copy = tmp_path_factory.mktemp(f"openrlhf-{release}-patched")
    shutil.copytree(site / "openrlhf", copy / "openrlhf")
    shutil.copytree(site / f"openrlhf-{release}.dist-info", copy / f"openrlhf-{release}.dist-info")
    patch = PATCHES / f"openrlhf-{release}.patch"
    subprocess.run(["git", "apply", str(patch)], cwd=copy, check=True, capture_output=True)
    return release, checks(site, release, "launcher"), checks(copy, release, "patched"), copy


def test_openrlhf_loss_with_reinforce_pro_equals_ours(openrlhf):
    release, launcher, patched, _ = openrlhf
    assert launcher["masked_frac"][0] > 0.02  # the band masks part of the batch: the comparison can fail
    for kind in OURS[release]:
        for setting in ("tok", "seq-dual"):
            ours = launcher[f"{kind}/{setting}/ours"]
            assert_same(launcher[f"{kind}/{setting}/theirs"], ours)  # the launcher's subclass
            assert_same(patched[f"{kind}/{setting}/theirs"], ours)  # OpenRLHF's surrogate, the patch's weights
            assert launcher[f"{kind}/{setting}/wide/theirs"][0] != pytest.approx(ours[0], rel=1e-6)  # masked: differs
    for key in [k for k in launcher if k.endswith("/global/theirs")]:  # 0.11.2's dp_size, batch_num_tokens, ...
        assert_same(launcher[key], launcher[key.replace("/theirs", "/ours")])
        assert launcher[key][0] != launcher[key.replace("/global", "")][0]  # they changed the loss
    assert any(k.endswith("/global/theirs") for k in launcher) == (release == "0.11.2")


def test_openrlhf_reinforce_pro_with_nothing_masked_is_openrlhf_own_raw_ratio_weighting(openrlhf):
    # With a band nothing leaves, reinforce_pro weighs every token by its raw ratio: OpenRLHF's own icepop /
    # token-mask does the same, in OpenRLHF's code. Ties this project's surrogate and aggregation to theirs.
    release, launcher, patched, _ = openrlhf
    for numbers in (launcher, patched):
        for kind in OURS[release]:
            for setting in ("tok", "seq-dual"):
                assert_same(
                    numbers[f"{kind}/{setting}/wide/theirs"], numbers[f"{RAW_RATIO[release]}/{setting}/wide/theirs"]
                )
        for setting in ("tok", "seq-dual"):  # and with IS off, this project's loss is OpenRLHF's
            assert_same(numbers[f"off/{setting}/ours"], numbers[f"off/{setting}/theirs"])


def test_openrlhf_0_11_2_every_level_mode_gating_equals_ours(openrlhf):
    """Each combination OpenRLHF 0.11.2 accepts (openrlhf/models/loss.py PolicyLoss, its own class, unpatched) gives
    the loss, clip fraction and gradient of the correction this project's command line selects for it."""
    release, launcher, patched, _ = openrlhf
    if release != "0.11.2":
        pytest.skip("the level / mode / gating flags are 0.11.2's")
    gates = sorted({"gate/" + k.split("/")[1] for k in launcher if k.startswith("gate/")})
    assert len(gates) == 7, gates  # token clip / mask ratio, seq mask ratio, and the four divergence gates
    for gate in gates:
        for numbers in (launcher, patched):
            for setting in ("tok", "seq-dual"):
                assert_same(numbers[f"{gate}/{setting}/theirs"], numbers[f"{gate}/{setting}/ours"])
        if "-ratio" not in gate:
            assert 0.0 < launcher[f"{gate}/masked_frac"][0] < 1.0, gate  # the gate cuts: the comparison can fail


def test_openrlhf_0_11_2_kl_unbiased_gradient_equals_ours(openrlhf):
    """OpenRLHF 0.11.2's compute_approx_kl (openrlhf/models/utils.py) with unbiased_gradient on and off, against
    kl_loss: the same value and gradient for k1, k2, k3 (float32, as OpenRLHF computes it); on, the three share one
    gradient, off, they do not."""
    release, launcher, _, _ = openrlhf
    if release != "0.11.2":
        pytest.skip("--algo.kl.unbiased_gradient is 0.11.2's")
    for est in ("k1", "k2", "k3"):
        for unbiased in (False, True):
            theirs, ours = launcher[f"kl/{est}/{unbiased}/theirs"], launcher[f"kl/{est}/{unbiased}/ours"]
            assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-9), (est, unbiased)
    grads = {est: launcher[f"kl/{est}/True/ours"][1] for est in ("k1", "k2", "k3")}
    assert grads["k1"] == pytest.approx(grads["k2"], rel=1e-6) == pytest.approx(grads["k3"], rel=1e-6)
    assert launcher["kl/k1/False/ours"][1] != pytest.approx(launcher["kl/k3/False/ours"][1], rel=1e-3)


def test_openrlhf_own_modes_unchanged(openrlhf):
    release, launcher, patched, _ = openrlhf
    for kind in OWN[release]:
        for setting in ("tok", "seq-dual"):
            key = f"{kind}/{setting}"
            assert launcher[f"{key}/theirs"] == launcher[f"{key}/unpatched"]  # the launcher's subclass: bitwise
            assert patched[f"{key}/theirs"] == launcher[f"{key}/unpatched"]  # the patched file: bitwise


def test_openrlhf_patched_flag_accepts_the_choice(openrlhf):
    import ast

    release, _, _, copy = openrlhf
    flag, choice = {"0.9.10": ("--vllm_is_correction_type", "reinforce_pro"),
                    "0.11.2": ("--algo.advantage.is_correction_level", "prefix")}[release]  # fmt: skip
    tree = ast.parse((copy / "openrlhf" / "cli" / "train_ppo_ray.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument"]
    (call,) = [c for c in calls if c.args and isinstance(c.args[0], ast.Constant) and c.args[0].value == flag]
    choices = next(ast.literal_eval(k.value) for k in call.keywords if k.arg == "choices")
    assert choice in choices and len(choices) == len(set(choices))


def test_launcher_gives_the_flag_the_choice_and_workers_the_hook():
    import argparse

    from reinforce_pro.integrations.openrlhf import RELEASES, WORKER_HOOK, _with_choice
    from reinforce_pro.integrations.releases import with_worker_hook

    release = RELEASES["0.9.10"]
    parser = argparse.ArgumentParser()
    add = _with_choice(argparse.ArgumentParser.add_argument, release)
    add(parser, "--vllm_is_correction_type", type=str, default="tis", choices=["tis", "icepop", "seq-mask-tis"])
    add(parser, "--other", choices=["a"])
    assert parser.parse_args(["--vllm_is_correction_type", "reinforce_pro"]).vllm_is_correction_type == "reinforce_pro"
    with pytest.raises(SystemExit):
        parser.parse_args(["--other", "reinforce_pro"])

    seen = {}
    init = with_worker_hook(lambda *a, runtime_env=None, **k: seen.update(runtime_env), WORKER_HOOK)
    init(runtime_env={"env_vars": {"NCCL_DEBUG": "WARN"}})  # what OpenRLHF passes: kept, the hook added
    assert seen == {"env_vars": {"NCCL_DEBUG": "WARN"}, "worker_process_setup_hook": WORKER_HOOK}
    with pytest.raises(ValueError, match="worker_process_setup_hook"):
        init(runtime_env={"worker_process_setup_hook": "someone.else"})


def test_launcher_refuses_a_missing_or_untested_release_in_one_line(tmp_path):
    result = run_python([], "-m", "reinforce_pro.integrations.openrlhf", "--help", check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: openrlhf is not installed: reinforce_pro's openrlhf integration supports openrlhf 0.9.10, 0.11.2 "
        "(docs/integrations.md)"
    ]
    dist = tmp_path / "openrlhf-0.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: openrlhf\nVersion: 0.9.9\n")
    result = run_python([tmp_path], "-m", "reinforce_pro.integrations.openrlhf", "--help", check=False)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: openrlhf 0.9.9 is not supported") and "0.9.10, 0.11.2" in line


def test_patch_command_prints_the_shipped_patch():
    result = run_python([], "-m", "reinforce_pro.integrations.openrlhf", "patch", "0.9.10")
    assert result.stdout == (PATCHES / "openrlhf-0.9.10.patch").read_text()
    result = run_python([], "-m", "reinforce_pro.integrations.openrlhf", "patch", "0.8.0", check=False)
    assert result.returncode == 2 and "no patch for OpenRLHF 0.8.0" in result.stderr


def test_after_import_runs_on_first_import_and_on_an_imported_module(tmp_path, monkeypatch):
    from reinforce_pro.integrations.releases import after_import

    (tmp_path / "rp_probe_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    after_import("rp_probe_module", lambda m: seen.append(m.VALUE))
    assert seen == []
    import rp_probe_module  # noqa: F401

    assert seen == [1]
    after_import("rp_probe_module", lambda m: seen.append(m.VALUE + 1))  # already imported: now
    assert seen == [1, 2]
    monkeypatch.delitem(sys.modules, "rp_probe_module")


def test_core_installs_without_ray_vllm_or_deepspeed():
    # What `pip install reinforce-pro` gives a user of another trainer: the correction needs torch and nothing
    # of this project's distributed stack; the dependencies of the package say so too.
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if d.split("[")[0].split("=")[0].split(">")[0].strip() in {"ray", "vllm", "deepspeed"}]
    heavy = "{'ray', 'vllm', 'deepspeed', 'transformers'}"
    code = f"import sys; from reinforce_pro.algos import compute_is_weights; assert not {heavy} & set(sys.modules)"
    run_python([], "-c", code)
    from reinforce_pro.algos import compute_is_weights

    weights, metrics = compute_is_weights(
        "reinforce_pro", torch.zeros(1, 3), torch.tensor([[0.0, 2.0, 0.0]]), torch.ones(1, 3), 0.5, 2.0
    )
    # log-ratios 0, -2, 0: prefix geometric means 1, exp(-1) = 0.37, exp(-2/3) = 0.51; only the second leaves
    # [0.5, 2], and the third, back in the band, keeps its own ratio exp(0)
    assert weights.tolist() == [[1.0, 0.0, 1.0]] and float(metrics["is/token_masked_frac"]) == pytest.approx(1 / 3)


# ------------------------------------------------------------------------------------------ TRL
@pytest.fixture(scope="module")
def trl(tmp_path_factory):
    site = installed("trl-1.16.0")
    result = run_python([site], str(CHECKS), "trl", "1.16.0", str(tmp_path_factory.mktemp("trl")))
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_trl_off_policy_sequence_mask_equals_our_opsm():
    """TRL 1.16's get_off_policy_mask, on 200 random batches with drift of five strengths and three deltas, keeps
    exactly the tokens this project's opsm keeps under the rollout anchor."""
    result = run_python([installed("trl-1.16.0")], str(CHECKS), "trl-opsm", "1.16.0", "-")
    numbers = json.loads(result.stdout.strip().splitlines()[-1])
    assert numbers["differing"] == [0]
    assert 0 < numbers["dropped"][0] < numbers["tokens"][0]  # the mask cuts: the comparison can fail


@pytest.mark.parametrize("mode", ["prefix_mask", "prefix_truncate"])
@pytest.mark.parametrize("loss_type", ["bnpo", "grpo"])  # token mean; mean of sequence means
def test_trl_loss_with_a_prefix_mode_equals_ours(trl, mode, loss_type):
    # TRL's _compute_loss (its clipped surrogate and aggregation, float64 model) times the prefix weights, against
    # this project's PolicyLoss on the same model, tokens and log-probs: the loss and a gradient projection.
    theirs, ours = trl[f"{mode}/{loss_type}/theirs"], trl[f"{mode}/{loss_type}/ours"]
    assert theirs == pytest.approx(ours, rel=1e-10, abs=1e-12)
    assert trl[f"{mode}/masked_frac"][0] > 0.02  # part of the batch is masked: the weights matter
    assert trl[f"{mode}/logged"][0] == pytest.approx(trl[f"{mode}/masked_frac"][0])  # and TRL logs is/*


def test_trl_own_modes_reach_trl_unchanged(trl):
    assert trl["overridden"] == ["_generate_and_score_completions"]
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        assert trl[f"dispatch/{mode}"] == [mode, mode, "TRL's"]  # TRL ran under its mode, its ratio kept
    assert trl["dispatch/prefix_mask"] == ["token_mask", "prefix_mask", "ours"]  # TRL's step, our weights


@pytest.mark.e2e
def test_trl_trains_end_to_end_with_vllm_and_prefix_mask(tmp_path):
    # TRL's own loop: vLLM (the CPU build, colocated) samples with log-probs, TRL recomputes the old ones, the
    # prefix weights go into TRL's loss, TRL logs them. The sync into vLLM is off (integration_checks.py says
    # why), so the engine's policy lags and the mismatch grows step by step.
    installed("trl-1.16.0")
    result = run_python([INSTALLED / "trl-1.16.0"], str(CHECKS), "trl-e2e", "1.16.0", str(tmp_path))
    history = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(history) == 4 and all(math.isfinite(h["loss"]) for h in history)
    assert history[0]["is/vllm_kl"] < 1e-3 < history[-1]["is/vllm_kl"]  # the same weights at first, then apart
    assert max(h["is/token_masked_frac"] for h in history) > 0  # the band [0.9, 1.1] masks once they drift
    assert all(0 < h["is/weight_mean"] < 2 for h in history)


# ------------------------------------------------------------------------------------------ verl
@pytest.fixture(scope="module")
def verl():
    site = installed("verl-0.9.1")
    result = run_python([site], str(CHECKS), "verl", "0.9.1", "-")
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_verl_loss_with_level_prefix_equals_ours(verl, agg):
    # verl's own pipeline (compute_rollout_correction_and_rejection_mask with rollout_is=prefix) and its own vanilla
    # policy loss, against this project's PolicyLoss: loss and gradient projection. verl adds 1e-8 to its per-sequence
    # token counts (seq-mean-token-mean), hence 1e-8.
    assert verl[f"prefix/{agg}/theirs"] == pytest.approx(verl[f"prefix/{agg}/ours"], rel=1e-8)
    assert verl["prefix/0.5_2.0/metric"][0] > 0.02  # the band masks part of the batch, reported under rollout_corr/
    # nothing outside the band: prefix weighs by the raw ratio, as verl's own token-level IcePop does
    assert verl[f"prefix/{agg}/wide"] == pytest.approx(verl[f"token/{agg}/wide"], rel=1e-12)
    assert verl[f"prefix/{agg}/wide"][0] != pytest.approx(verl[f"prefix/{agg}/theirs"][0], rel=1e-6)


def test_verl_own_levels_unchanged_and_a_single_threshold_refused(verl):
    for key in ("own/token/2.0", "own/token/0.5_2.0", "own/sequence/5.0", "own/sequence/0.5_2.0"):
        assert verl[key] == [0.0]  # the registered function gives verl's weights bitwise for its own levels
    assert verl["single_threshold_refused"] == [1.0]


def test_verl_launcher_refuses_a_missing_release_in_one_line():
    result = run_python([], "-m", "reinforce_pro.integrations.verl", check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: verl is not installed: reinforce_pro's verl integration supports verl 0.9.1 (docs/integrations.md)"
    ]
