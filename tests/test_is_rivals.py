"""The published rivals of reinforce_pro (algos/is_rivals.py): hand-computed cases against each source's equations
or reference code, the anchor, the settings, and the checks every correction shares.

Most cases use one response of four tokens whose numerator (old) probabilities are p = [0.5, 0.9, 0.2, 0.6] and
whose rollout probabilities are mu = 0.5 everywhere: rho = [1, 1.8, 0.4, 1.2], |p - mu| = [0, 0.4, 0.3, 0.1].
"""

import math

import pytest
import torch

from reinforce_pro.algos.is_correction import (
    IS_CORRECTIONS,
    compute_is_weights,
    correction_params,
    default_band,
    validate_is_config,
)
from reinforce_pro.algos.is_correction import NEEDS_ADVANTAGES as SIGN_GATES  # the rivals' and the variants'
from reinforce_pro.algos.is_rivals import DIVERGENCE_BANDS, NEEDS_ADVANTAGES, RIVAL_PARAMS, RIVALS

P = [0.5, 0.9, 0.2, 0.6]
RHO = [1.0, 1.8, 0.4, 1.2]


def four_tokens(p=P, mu=0.5, rows=1):
    old = torch.tensor([p] * rows, dtype=torch.float64).log()
    rollout = torch.full_like(old, math.log(mu))
    return old, rollout, torch.ones_like(old, dtype=torch.bool)


def weights(name, old, rollout, mask, band=(0.5, 5.0), **kw):
    w, _ = compute_is_weights(name, old, rollout, mask, *band, **kw)
    return w


def from_log_ratios(rows, mask=None):
    """old = -1 everywhere, rollout = old - r, so that the log ratio is r exactly."""
    r = torch.tensor(rows, dtype=torch.float64)
    old = torch.full_like(r, -1.0)
    return old, old - r, torch.ones_like(r, dtype=torch.bool) if mask is None else torch.tensor(mask)


# ---------------------------------------------------------------------------------------------- each rival
def test_minpro_weights_each_token_by_the_smallest_earlier_ratio():
    # rho = [2, 0.25, 3, 1]: running minimum of the earlier ratios, starting at 1: [1, 1, 0.25, 0.25]
    old, rollout, mask = from_log_ratios([[math.log(2), -math.log(4), math.log(3), 0.0]])
    torch.testing.assert_close(weights("minpro", old, rollout, mask), torch.tensor([[2.0, 0.25, 0.75, 0.25]],
                               dtype=torch.float64), rtol=0, atol=1e-12)  # fmt: skip


def test_minpro_ignores_prompt_tokens_and_ends_the_prefix_at_a_nonfinite_token():
    old, rollout, _ = from_log_ratios([[-5.0, math.log(0.5), 0.0, 0.0, 0.0]])
    mask = torch.tensor([[False, True, True, True, True]])
    rollout[0, 3] = float("nan")
    w = weights("minpro", old, rollout, mask)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0]], dtype=torch.float64), rtol=0, atol=1e-12)


def test_ctpo_clips_the_cumulative_log_ratio_to_a_window_growing_as_sqrt_t():
    # cum r = [0.3, 0.2, -0.3, -0.3]; window [-0.1 sqrt(t), 0.2 sqrt(t)] -> [0.2, 0.2, -0.1 sqrt 3, -0.2]
    old, rollout, mask = from_log_ratios([[0.3, -0.1, -0.5, 0.0]])
    args = {"clip_low": 0.1, "clip_high": 0.2, "power": 0.5}
    expected = torch.tensor([[0.2, 0.2, -0.1 * math.sqrt(3), -0.2]], dtype=torch.float64).exp()
    torch.testing.assert_close(weights("ctpo", old, rollout, mask, params=args), expected, rtol=0, atol=1e-12)


def test_ctpo_with_a_wide_window_is_the_prefix_product_of_ratios():
    old, rollout, mask = from_log_ratios([[0.3, -0.1, -0.5, 0.2]])
    w = weights("ctpo", old, rollout, mask, params={"clip_low": 10.0, "clip_high": 10.0})
    torch.testing.assert_close(w, torch.tensor([[0.3, 0.2, -0.3, -0.1]], dtype=torch.float64).exp(), rtol=0, atol=1e-12)


def test_ctpo_caps_the_cumulative_log_ratio_at_ten_before_its_window():
    """horizon-llm/CTPO acc4021 (core_algos.py): clamp(cum log-ratio, max=10), then the window; binds only where the
    window reaches past 10. Cumulative log-ratios 6, 12, 18 in a window of +-100: exp(6), exp(10), exp(10)."""
    old, rollout, mask = from_log_ratios([[6.0, 6.0, 6.0]])
    wide = {"clip_low": 100.0, "clip_high": 100.0}
    expected = torch.tensor([[6.0, 10.0, 10.0]], dtype=torch.float64).exp()
    torch.testing.assert_close(weights("ctpo", old, rollout, mask, params=wide), expected, rtol=0, atol=1e-9)
    uncapped = weights("ctpo", old, rollout, mask, params={**wide, "cap": 50.0})
    torch.testing.assert_close(
        uncapped, torch.tensor([[6.0, 12.0, 18.0]], dtype=torch.float64).exp(), rtol=1e-12, atol=0
    )


def test_geo_seq_mask_is_verls_seq_mean_k1_at_the_reciprocal_band():
    """verl's seq_mean_k1 keeps a sequence when LOW <= exp(mean(-r)) <= HIGH; geo-seq-mask bounds exp(mean r). Mean
    log ratios 1.0, 0.0, -1.0 (exp: 2.72, 1, 0.37) at verl's [0.5, 5] keep the last two; geo-seq-mask needs the
    reciprocal band [0.2, 2] for the same decision, and at [0.5, 5] keeps the first two instead."""
    old, rollout, mask = from_log_ratios([[1.0, 1.0], [0.0, 0.0], [-1.0, -1.0]])
    r = old - rollout
    verl = ((-r).mean(-1).exp() >= 0.5) & ((-r).mean(-1).exp() <= 5.0)
    assert verl.tolist() == [False, True, True]
    kept = weights("geo-seq-mask", old, rollout, mask, band=(1 / 5.0, 1 / 0.5))[:, 0] > 0
    assert kept.tolist() == verl.tolist()
    assert (weights("geo-seq-mask", old, rollout, mask, band=(0.5, 5.0))[:, 0] > 0).tolist() == [True, True, False]


def test_tis_with_the_threshold_alone_is_the_upper_only_truncation():
    """Yao et al.'s (and verl's) TIS: min(rho, C). A band [0, C] (the threshold given alone) is exactly that."""
    old, rollout, mask = from_log_ratios([[math.log(0.1), 0.0, math.log(3.0), math.log(9.0)]])
    expected = torch.tensor([[0.1, 1.0, 3.0, 5.0]], dtype=torch.float64)
    torch.testing.assert_close(weights("tis", old, rollout, mask, band=(0.0, 5.0)), expected, rtol=0, atol=1e-12)


def test_cppos_budget_quantile_and_scale_are_settings():
    """The budget delta_b' = clamp(quantile_q(D), delta_b, scale x delta_b). four_tokens: D = [0, .4, .3, .1],
    Z = wD = [0, .373, .26, .08], W_<t = [0, 1, 1.933, 2.8], S_<t = [0, 0, .373, .633]. Scale 2 clamps p90 = .37 to
    .04: c = [.2, .2, -.096, -.321] and token 3 fails. Scale 20 lets .37 through: c = .2 at every token (the cap
    delta), so token 3 (Z .08) fits and token 1 (Z .373) still does not."""
    old, rollout, mask = four_tokens()
    adv = torch.tensor([1.0], dtype=torch.float64)
    default = weights("cppo", old, rollout, mask, advantages=adv)
    same = weights("cppo", old, rollout, mask, advantages=adv, params={"quantile": 0.9, "budget_scale": 2.0})
    torch.testing.assert_close(default, same, rtol=0, atol=0)
    wider = weights("cppo", old, rollout, mask, advantages=adv, params={"budget_scale": 20.0})
    assert wider[0, 3].item() == pytest.approx(1.2) and default[0, 3].item() == 0.0  # token 3 now fits
    assert wider[0, 1].item() == 0.0  # token 1 (Z .373 > c .2) still does not


@pytest.mark.parametrize(
    "advantage, expected",
    [
        # D = [0, .4, .3, .1], w = [1, 14/15, 13/15, .8], Z = wD, budget = clamp(p90(D) = .37, .02, .04) = .04;
        # c = min(.2, .2 + .04 W_<t - S_<t) = [.2, .2, -.096, -.3213]: only token 0 fits. Toward mu (A (rho-1) <= 0)
        # is always kept: A > 0 keeps token 2 (rho .4), A < 0 keeps tokens 1 and 3 (rho 1.8, 1.2).
        pytest.param(1.0, [1.0, 0.0, 0.4, 0.0], id="positive-advantage"),
        pytest.param(-1.0, [1.0, 1.8, 0.0, 1.2], id="negative-advantage"),
    ],
)
def test_cppo_hand_computed_from_the_paper_equations(advantage, expected):
    """CPPO, arXiv 2606.10968 Eq. 8-11, as Tencent-Hunyuan/UniRL 30899fc unirl/algorithms/cppo.py computes them."""
    old, rollout, mask = four_tokens()
    w = weights("cppo", old, rollout, mask, advantages=torch.tensor([advantage], dtype=torch.float64))
    torch.testing.assert_close(w, torch.tensor([expected], dtype=torch.float64), rtol=0, atol=1e-12)


def test_cppo_position_weights_count_action_tokens_only():
    """Padding and prompt tokens around the response change neither the positions nor the decision."""
    old, rollout, _ = four_tokens()
    adv = torch.tensor([1.0], dtype=torch.float64)
    plain = weights("cppo", old, rollout, torch.ones(1, 4, dtype=torch.bool), advantages=adv)
    pad = torch.cat([torch.zeros(1, 2, dtype=torch.float64), old, torch.zeros(1, 3, dtype=torch.float64)], dim=-1)
    padded_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    padded = weights("cppo", pad, torch.full_like(pad, math.log(0.5)), padded_mask, advantages=adv)
    torch.testing.assert_close(padded[:, 2:6], plain, rtol=0, atol=0)


@pytest.mark.parametrize(
    "advantage, expected",
    [
        pytest.param(1.0, [1.0, 0.0, 0.4, 1.2], id="positive-drops-a-gain-over-high"),  # p - mu = .4 > .2
        pytest.param(-1.0, [1.0, 1.8, 0.0, 1.2], id="negative-drops-a-loss-over-low"),  # p - mu = -.3 < -.2
        pytest.param(0.0, [1.0, 1.8, 0.0, 1.2], id="zero-is-the-negative-side"),  # prime-rl: where(A > 0, high, low)
    ],
)
def test_dppo_tv_masks_one_side_by_the_advantage_sign(advantage, expected):
    """prime-rl 559b447 src/prime_rl/trainer/rl/loss.py default_loss_fn, dppo_mask_low = dppo_mask_high = 0.2."""
    old, rollout, mask = four_tokens()
    w = weights("dppo-tv", old, rollout, mask, advantages=torch.tensor([advantage], dtype=torch.float64))
    torch.testing.assert_close(w, torch.tensor([expected], dtype=torch.float64), rtol=0, atol=1e-12)


def test_kpop_keeps_a_token_only_within_phi_both_ways():
    # max(KL_B(p||mu), KL_B(mu||p)): p = .9 -> .511, p = .2 -> .223, p = .6 -> .0204 (phi = .1)
    old, rollout, mask = four_tokens()
    w, m = compute_is_weights("kpop", old, rollout, mask, 0.5, 5.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 0.0, 1.2]], dtype=torch.float64), rtol=0, atol=1e-12)
    kl = [0.0, 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1), 0.5 * math.log(2.5) + 0.5 * math.log(0.625),
          0.5 * math.log(0.5 / 0.6) + 0.5 * math.log(0.5 / 0.4)]  # fmt: skip
    assert float(m["is/binary_kl_mean"]) == pytest.approx(sum(kl) / 4, abs=1e-6)


def test_trm_drops_a_whole_sequence_by_its_largest_token_divergence():
    # k3 = rho - 1 - ln rho: row 0 has rho 1.8 (k3 .212 > .2): dropped whole; row 1 (rho 1.2, .8: .018, .023) kept
    old = torch.tensor([[0.5, 0.9], [0.6, 0.4]], dtype=torch.float64).log()
    rollout, mask = torch.full_like(old, math.log(0.5)), torch.ones(2, 2, dtype=torch.bool)
    w = weights("trm", old, rollout, mask)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0], [1.2, 0.8]], dtype=torch.float64), rtol=0, atol=1e-12)


def test_opsm_drops_negative_advantage_sequences_whose_mean_log_ratio_is_too_far():
    # row 0: mean(-r) = 0.2 > delta 0.1; row 1: mean(-r) = -0.1
    old, rollout, mask = from_log_ratios([[-0.3, -0.1], [0.3, -0.1]])
    for adv, kept in ((-1.0, [False, True]), (1.0, [True, True]), (0.0, [True, True])):
        w = weights("opsm", old, rollout, mask, advantages=torch.full((2,), adv), params={"delta": 0.1})
        assert (w > 0).all(dim=-1).tolist() == kept, adv
        assert (w > 0).any(dim=-1).tolist() == kept, adv


def test_geo_seq_mask_is_seq_mask_tis_gate_with_weight_one():
    old, rollout, mask = from_log_ratios([[math.log(9), 0.0], [math.log(2), -math.log(2)], [0.3, 0.1]])
    geo = weights("geo-seq-mask", old, rollout, mask, band=(0.5, 2.0))
    seq = weights("seq-mask-tis", old, rollout, mask, band=(0.5, 2.0))
    torch.testing.assert_close(geo, torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]], dtype=torch.float64))
    assert torch.equal(geo > 0, seq > 0)
    for anchor_mask_only in (True,):  # under the rollout anchor both give the mask alone
        assert torch.equal(
            weights("geo-seq-mask", old, rollout, mask, band=(0.5, 2.0), mask_only=anchor_mask_only),
            weights("seq-mask-tis", old, rollout, mask, band=(0.5, 2.0), mask_only=anchor_mask_only),
        )


@pytest.mark.parametrize(
    "name, band, expected",
    [
        pytest.param("token-tv", (0.0, 0.2), [1.0, 0.0, 0.0, 1.2], id="token-tv"),  # |p - mu| = [0, .4, .3, .1]
        # KL_B(mu || p) = [0, .511, .223, .0204]
        pytest.param("token-binary-kl", (0.0, 0.1), [1.0, 0.0, 0.0, 1.2], id="token-binary-kl"),
        pytest.param("seq-tv", (0.0, 0.25), RHO, id="seq-tv-kept"),  # mean |p - mu| = 0.2
        pytest.param("seq-tv", (0.0, 0.15), [0.0] * 4, id="seq-tv-dropped"),
        pytest.param("seq-binary-kl", (0.0, 0.2), RHO, id="seq-binary-kl-kept"),  # mean KL_B = .1886
        pytest.param("seq-binary-kl", (0.0, 0.1), [0.0] * 4, id="seq-binary-kl-dropped"),
    ],
)
def test_openrlhf_divergence_gates_hand_computed(name, band, expected):
    old, rollout, mask = four_tokens()
    w = weights(name, old, rollout, mask, band=band)
    torch.testing.assert_close(w, torch.tensor([expected], dtype=torch.float64), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------- settings and errors
def test_every_rival_is_in_the_table_and_its_settings_are_known():
    assert set(RIVALS) <= set(IS_CORRECTIONS)
    assert set(RIVAL_PARAMS) | set(NEEDS_ADVANTAGES) | set(DIVERGENCE_BANDS) <= set(RIVALS)
    assert correction_params("cppo", {"delta": 0.1}) == {
        "delta": 0.1, "w_min": 0.8, "delta_b": 0.02, "quantile": 0.9, "budget_scale": 2.0
    }  # fmt: skip
    assert correction_params("tis") == {}


@pytest.mark.parametrize(
    "name, band, params, message",
    [
        pytest.param(
            "cppo",
            (0.5, 5.0),
            {"delt": 0.1},
            "cppo has no setting delt (its settings: delta, w_min, delta_b, quantile, budget_scale)",
            id="unknown-setting",
        ),  # fmt: skip
        pytest.param("tis", (0.5, 5.0), {"x": 1.0}, "tis has no setting x (its settings: none)", id="no-settings"),
        pytest.param("kpop", (0.5, 5.0), {"phi": -1.0}, "phi must be a finite number >= 0", id="negative"),
        pytest.param("cppo", (0.5, 5.0), {"quantile": 1.5}, "quantile is a fraction: it must be <= 1", id="fraction"),
        pytest.param("kpop", (0.5, 5.0), {"phi": float("nan")}, "phi must be a finite number >= 0", id="nan"),
        pytest.param("token-tv", (0.5, 5.0), None, "gates a divergence, which takes an upper bound only", id="band"),
    ],
)
def test_bad_settings_are_one_clear_error(name, band, params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_is_config(name, *band, params)


@pytest.mark.parametrize("name", sorted(SIGN_GATES))
def test_a_sign_gate_without_advantages_says_so(name):
    old, rollout, mask = four_tokens()
    with pytest.raises(ValueError, match=f"{name} gates on the advantage's sign"):
        compute_is_weights(name, old, rollout, mask, 0.5, 5.0)


def test_default_band_gives_divergence_gates_their_own():
    assert default_band("token-tv", (0.5, 5.0)) == (0.0, 0.2)
    assert default_band("icepop", (0.5, 5.0)) == (0.5, 5.0)


@pytest.mark.parametrize("name", sorted(RIVALS))
def test_mask_only_gives_the_keep_decision_as_zero_one(name):
    old, rollout, mask = four_tokens(rows=2)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    band = default_band(name, (0.5, 5.0))
    w = weights(name, old, rollout, mask, band=band, advantages=adv)
    w01 = weights(name, old, rollout, mask, band=band, advantages=adv, mask_only=True)
    assert torch.equal(w01, (w > 0).to(w.dtype))


# ---------------------------------------------------------------------------------------------- the anchor
def anchor_batch():
    g = torch.Generator().manual_seed(5)
    old = -torch.rand(4, 9, generator=g, dtype=torch.float64) * 2
    rollout = old - torch.randn(4, 9, generator=g, dtype=torch.float64).cumsum(-1) * 0.6
    log_probs = (old + torch.randn(4, 9, generator=g, dtype=torch.float64) * 0.1).requires_grad_()
    adv = torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, 9)
    mask = torch.arange(9).expand(4, 9) < torch.tensor([[9], [6], [3], [8]])
    return log_probs, old, rollout, adv, mask


def test_rollout_anchor_with_tis_is_the_surrogate_against_the_rollout_policy():
    """verl's bypass mode: the PPO ratio is pi / pi_rollout, and tis (a weight, no mask) adds nothing."""
    from reinforce_pro.algos.losses import PolicyLoss

    log_probs, old, rollout, adv, mask = anchor_batch()
    anchored, _ = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type="tis", vllm_is_anchor="rollout")(
        log_probs, old, adv, mask, rollout
    )
    bypass, _ = PolicyLoss()(log_probs, rollout, adv, mask)
    assert anchored.item() == pytest.approx(bypass.item(), abs=1e-12)


@pytest.mark.parametrize("name", ["icepop", "reinforce_pro", "dppo-tv", "cppo", "kpop"])
def test_rollout_anchor_gates_the_current_policy_and_weights_by_the_mask_alone(name):
    """The gate compares the current policy with the rollout policy (the old log-probs do not enter it), and a
    kept token's loss is the PPO term of pi / pi_rollout unweighted."""
    from reinforce_pro.algos.losses import PolicyLoss

    log_probs, old, rollout, adv, mask = anchor_batch()
    loss_fn = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type=name, vllm_is_anchor="rollout")
    loss, m = loss_fn(log_probs, old, adv, mask, rollout)
    keep, _ = compute_is_weights(name, log_probs.detach(), rollout, mask, 0.5, 5.0, advantages=adv, mask_only=True)
    ratio = (log_probs - rollout).exp()
    per_token = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    expected = (per_token * keep).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    assert 0.0 < float(m["is/token_masked_frac"]) < 1.0  # the case exercises the mask
    shifted, _ = loss_fn(log_probs, old + 0.3, adv, mask, rollout)
    assert shifted.item() == loss.item()
    (grad,) = torch.autograd.grad(loss, log_probs)
    assert (grad[mask & (keep == 0)] == 0).all()


def test_an_unknown_anchor_is_refused():
    from reinforce_pro.algos.losses import SurrogateConfig

    with pytest.raises(ValueError, match="unknown vllm_is_anchor 'new'; valid: old, rollout"):
        SurrogateConfig(vllm_is_anchor="new")


def test_settings_reach_the_correction_through_the_loss():
    from reinforce_pro.algos.losses import PolicyLoss, SurrogateConfig

    log_probs, old, rollout, adv, mask = anchor_batch()
    tight = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type="kpop",
                       vllm_is_correction_args={"phi": 1e-4})  # fmt: skip
    loose = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type="kpop",
                       vllm_is_correction_args={"phi": 10.0})  # fmt: skip
    _, m_tight = tight(log_probs, old, adv, mask, rollout)
    _, m_loose = loose(log_probs, old, adv, mask, rollout)
    assert float(m_tight["is/token_masked_frac"]) > 0.5 and float(m_loose["is/token_masked_frac"]) == 0.0
    with pytest.raises(ValueError, match="kpop has no setting delta"):
        SurrogateConfig(
            enable_vllm_is_correction=True, vllm_is_correction_type="kpop", vllm_is_correction_args={"delta": 1}
        )


def test_binary_kl_gate_keeps_confident_on_policy_tokens_in_float32():
    """In float32 the binary KL of p ~ mu ~ 1 rounds below 0 for some tokens; OpenRLHF 0.11.2's LOW = 0 bound then
    drops them (4,399 of 100,000 here). token-binary-kl floors the statistic at 0 and keeps every one."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(1, 100_000, generator=g) * 0.01
    rollout = old + torch.randn(1, 100_000, generator=g) * 1e-4
    mask = torch.ones_like(old, dtype=torch.bool)
    p, mu = old.exp().clamp(1e-6, 1 - 1e-6), rollout.exp().clamp(1e-6, 1 - 1e-6)
    raw = mu * (mu / p).log() + (1 - mu) * ((1 - mu) / (1 - p)).log()
    assert int((raw < 0).sum()) > 1000  # the float32 rounding the floor is there for
    w = weights("token-binary-kl", old, rollout, mask, band=(0.0, 0.1))
    assert bool((w > 0).all())
