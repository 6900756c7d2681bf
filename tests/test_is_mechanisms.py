"""The mechanism variants (algos/is_mechanisms.py): each moves one ingredient between reinforce_pro and cppo /
dppo-tv; hand-computed cases show the variant differs from its parent exactly where that ingredient acts.

four_tokens (test_is_rivals.py): p = [0.5, 0.9, 0.2, 0.6], mu = 0.5, so rho = [1, 1.8, 0.4, 1.2],
|p - mu| = [0, .4, .3, .1], log rho = [0, .5878, -.9163, .1823] and reinforce_pro's prefix geometric mean
g = exp([0, .2939, -.1095, -.0365]) = [1, 1.3416, .8963, .9642].
"""

import math

import pytest
import torch

from reinforce_pro.algos.is_correction import (
    DIVERGENCE_BANDS,
    IS_CORRECTIONS,
    NEEDS_ADVANTAGES,
    compute_is_weights,
    correction_params,
    default_band,
)
from reinforce_pro.algos.is_mechanisms import MECHANISMS
from tests.test_is_rivals import four_tokens, weights

POS, NEG = torch.tensor([1.0], dtype=torch.float64), torch.tensor([-1.0], dtype=torch.float64)


def check(name, expected, band, p=None, advantages=None):
    old, rollout, mask = four_tokens() if p is None else four_tokens(p)
    w = weights(name, old, rollout, mask, band=band, advantages=advantages)
    torch.testing.assert_close(w, torch.tensor([expected], dtype=torch.float64), rtol=0, atol=1e-12)


def test_every_variant_is_in_the_table_with_its_tables():
    assert set(MECHANISMS) <= set(IS_CORRECTIONS)
    assert {"reinforce_pro-sign", "dppo-ratio", "cppo-nosign", "cppo-flat"} <= NEEDS_ADVANTAGES
    assert default_band("reinforce_pro-tv", (0.5, 5.0)) == DIVERGENCE_BANDS["reinforce_pro-tv"] == (0.0, 0.05)
    assert correction_params("cppo-flat")["w_min"] == 1.0
    assert correction_params("cppo-nosign") == correction_params("cppo")
    assert correction_params("reinforce_pro-pos") == {"w_min": 0.8}


@pytest.mark.parametrize(
    "band, expected",
    [
        # the prefix mean of |p - mu| is [0, .2, .2333, .2]
        pytest.param((0.0, 0.05), [1.0, 0.0, 0.0, 0.0], id="default-band-keeps-the-undrifted-start"),
        pytest.param((0.0, 0.21), [1.0, 1.8, 0.0, 1.2], id="wider-drops-only-the-mean-over-it"),
    ],
)
def test_reinforce_pro_tv_gates_the_prefix_mean_of_the_probability_change(band, expected):
    check("reinforce_pro-tv", expected, band)


def test_reinforce_pro_tv_is_a_divergence_gate():
    old, rollout, mask = four_tokens()
    with pytest.raises(ValueError, match="gates a divergence"):
        compute_is_weights("reinforce_pro-tv", old, rollout, mask, 0.5, 5.0)


@pytest.mark.parametrize(
    "advantage, expected",
    [
        # band [.9, 1.25]: g_1 = 1.34 is above it, g_2 = .896 below; reinforce_pro masks both
        pytest.param(POS, [1.0, 0.0, 0.4, 1.2], id="positive-bounds-the-rise-only"),
        pytest.param(NEG, [1.0, 1.8, 0.0, 1.2], id="negative-bounds-the-fall-only"),
    ],
)
def test_reinforce_pro_sign_bounds_the_side_the_advantage_pushes(advantage, expected):
    check("reinforce_pro-sign", expected, (0.9, 1.25), advantages=advantage)
    check("reinforce_pro", [1.0, 0.0, 0.0, 1.2], (0.9, 1.25))


def test_reinforce_pro_pos_widens_the_band_along_the_response():
    """w = [1, 14/15, 13/15, .8]: g^w = exp([0, .2743, -.0949, -.0292]) = [1, 1.3156, .9095, .9712]. At [.9, 1.25]
    token 2 (.9095) is now inside, token 1 (1.3156) still outside."""
    check("reinforce_pro-pos", [1.0, 0.0, 0.4, 1.2], (0.9, 1.25))
    old, rollout, mask = four_tokens()
    flat = weights("reinforce_pro-pos", old, rollout, mask, band=(0.9, 1.25), params={"w_min": 1.0})
    torch.testing.assert_close(flat, weights("reinforce_pro", old, rollout, mask, band=(0.9, 1.25)), rtol=0, atol=0)


@pytest.mark.parametrize(
    "advantage, expected",
    [
        pytest.param(POS, [1.0, 0.0, 0.4, 1.2], id="positive-drops-a-ratio-over-high"),
        pytest.param(NEG, [1.0, 1.8, 0.0, 1.2], id="negative-drops-a-ratio-under-low"),
        pytest.param(torch.zeros(1, dtype=torch.float64), [1.0, 1.8, 0.0, 1.2], id="zero-is-the-negative-side"),
    ],
)
def test_dppo_ratio_is_dppos_sign_rule_on_the_ratio_band(advantage, expected):
    check("dppo-ratio", expected, (0.5, 1.5), advantages=advantage)


@pytest.mark.parametrize(
    "advantage, cppo, nosign",
    [
        # test_is_rivals' CPPO case: only token 0 fits the budget; cppo keeps the tokens moving toward mu besides
        pytest.param(POS, [1.0, 0.0, 0.4, 0.0], [1.0, 0.0, 0.0, 0.0], id="positive"),
        pytest.param(NEG, [1.0, 1.8, 0.0, 1.2], [1.0, 0.0, 0.0, 0.0], id="negative"),
    ],
)
def test_cppo_nosign_gates_the_tokens_moving_toward_mu_too(advantage, cppo, nosign):
    check("cppo", cppo, (0.5, 5.0), advantages=advantage)
    check("cppo-nosign", nosign, (0.5, 5.0), advantages=advantage)


def test_cppo_flat_weighs_a_late_divergence_fully():
    """p = [.5, .5, .5, .72]: D_3 = .22. CPPO weighs it by w_3 = .8 to Z_3 = .176, within the budget c_3 = .2 (the
    cap delta: W_<3 = 2.8, S_<3 = 0); cppo-flat's w_3 = 1 leaves Z_3 = .22 > .2, so it drops token 3 (rho 1.44,
    moving away from mu under A > 0)."""
    p = [0.5, 0.5, 0.5, 0.72]
    check("cppo", [1.0, 1.0, 1.0, 1.44], (0.5, 5.0), p=p, advantages=POS)
    check("cppo-flat", [1.0, 1.0, 1.0, 0.0], (0.5, 5.0), p=p, advantages=POS)


@pytest.mark.parametrize("name", ["reinforce_pro-tv", "reinforce_pro-sign", "reinforce_pro-pos"])
def test_prefix_variants_end_the_prefix_at_a_nonfinite_token(name):
    old = torch.tensor([[-1.0, float("nan"), -1.0, -1.0]], dtype=torch.float64)
    rollout = torch.full_like(old, -1.0)
    band = default_band(name, (0.5, 5.0))
    w, m = compute_is_weights(name, old, rollout, torch.ones_like(old, dtype=torch.bool), *band, advantages=POS)
    assert w.tolist() == [[1.0, 0.0, 0.0, 0.0]] and float(m["is/nonfinite_tokens"]) == 1.0
    assert math.isfinite(float(w.sum()))
