"""PolicyLoss / ValueLoss / aggregate_loss: hand-computed cases, agreement with OpenRLHF's formulas,
gradient checks, sharding invariance, and properties."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reinforce_pro.algos.is_correction import IS_CORRECTIONS
from reinforce_pro.algos.is_correction import default_band as band
from reinforce_pro.algos.losses import DEFAULT_IS_THRESHOLD, PolicyLoss, ValueLoss
from reinforce_pro.algos.masked import aggregate_loss

E2 = math.exp(2.0)


def band_of(name: str) -> dict:
    """The threshold keyword for `name`: the default ratio band, or a divergence gate's own band."""
    return {"vllm_is_truncated_threshold": band(name, DEFAULT_IS_THRESHOLD)}


def hand_batch():
    """Row 0: log ratios [0.5, -0.5, 2.0 | pad], advantages [1, -1, -1 | 5].
    Row 1: log ratios [0, 0 | pad, pad], advantages [1, 1 | 9, 9]."""
    old = torch.full((2, 4), -1.0, dtype=torch.float64)
    log_ratio = torch.tensor([[0.5, -0.5, 2.0, 7.0], [0.0, 0.0, 3.0, 3.0]], dtype=torch.float64)
    log_probs = (old + log_ratio).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, -1.0, 5.0], [1.0, 1.0, 9.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    return log_probs, old, adv, mask


# Per-token PPO losses (eps 0.2): row 0 -> [-1.2 (clipped), 0.8 (clipped), e^2 (unclipped, adv < 0)],
# row 1 -> [-1, -1]. Dual clip 3 caps the third token of row 0 at 3.
ROW0_PPO, ROW0_DUAL = [-1.2, 0.8, E2], [-1.2, 0.8, 3.0]
G = math.exp(2 / 3)  # GSPO sequence ratio of row 0
ROW0_GSPO = [-1.2, G, G]


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        pytest.param({}, (sum(ROW0_PPO) - 2) / 5, id="ppo-token"),
        pytest.param({"token_level_loss": False}, (sum(ROW0_PPO) / 3 - 1) / 2, id="ppo-seq"),
        pytest.param({"dual_clip": 3.0}, (sum(ROW0_DUAL) - 2) / 5, id="ppo-dualclip-token"),
        pytest.param(
            {"dual_clip": 3.0, "token_level_loss": False}, (sum(ROW0_DUAL) / 3 - 1) / 2, id="ppo-dualclip-seq"
        ),
        pytest.param({"policy_loss_type": "gspo"}, (sum(ROW0_GSPO) / 3 - 1) / 2, id="gspo"),
        pytest.param(
            {"policy_loss_type": "gspo", "token_level_loss": False}, (sum(ROW0_GSPO) / 3 - 1) / 2, id="gspo-seq"
        ),
    ],
)
def test_policy_loss_hand_computed(kwargs, expected):
    log_probs, old, adv, mask = hand_batch()
    loss, m = PolicyLoss(**kwargs)(log_probs, old, adv, action_mask=mask)
    assert loss.item() == pytest.approx(expected, abs=1e-9)
    if kwargs.get("policy_loss_type", "ppo") == "ppo":
        assert float(m["policy/clip_frac"]) == pytest.approx(2 / 5, abs=1e-9)
    assert float(m["policy/ppo_kl"]) == pytest.approx(-2 / 5, abs=1e-9)


@pytest.mark.parametrize(
    "name, row0_weights, row1_weights",
    [
        # rollout log ratios r: row 0 [0, ln 27, 0], row 1 [ln 16, 0]; band [0.5, 2.5].
        # prefix geometric means: row 0 [1, 5.2, 3], row 1 [16, 4]: reinforce_pro keeps only the first token.
        pytest.param("tis", [1, 2.5, 1], [2.5, 1], id="tis"),
        pytest.param("icepop", [1, 0, 1], [0, 1], id="icepop"),
        pytest.param("reinforce_pro", [1, 0, 0], [0, 0], id="reinforce_pro"),
    ],
)
def test_policy_loss_with_is_hand_computed(name, row0_weights, row1_weights):
    log_probs, old, adv, mask = hand_batch()
    r = torch.tensor([[0.0, math.log(27), 0.0, 0.0], [math.log(16), 0.0, 0.0, 0.0]], dtype=torch.float64)
    loss_fn = PolicyLoss(
        enable_vllm_is_correction=True, vllm_is_truncated_threshold=[0.5, 2.5], vllm_is_correction_type=name
    )
    loss, m = loss_fn(log_probs, old, adv, action_mask=mask, rollout_log_probs=old - r)
    row0 = sum(w * x for w, x in zip(row0_weights, ROW0_PPO, strict=True))
    row1 = sum(w * x for w, x in zip(row1_weights, [-1.0, -1.0], strict=True))
    assert loss.item() == pytest.approx((row0 + row1) / 5, abs=1e-9)
    assert float(m["is/vllm_kl"]) == pytest.approx(-(math.log(27) + math.log(16)) / 5, abs=1e-9)


def test_seq_mask_tis_masks_whole_sequence():
    log_probs, old, adv, mask = hand_batch()
    r = torch.tensor([[0.0, math.log(27), 0.0, 0.0], [0.1, -0.1, 0.0, 0.0]], dtype=torch.float64)
    loss_fn = PolicyLoss(
        enable_vllm_is_correction=True, vllm_is_truncated_threshold=[0.5, 2.0], vllm_is_correction_type="seq-mask-tis"
    )
    loss, m = loss_fn(log_probs, old, adv, action_mask=mask, rollout_log_probs=old - r)
    # row 0: geo mean 27^(1/3) = 3 -> whole row masked; row 1 kept with token ratios e^0.1, e^-0.1
    expected = (-math.exp(0.1) - math.exp(-0.1)) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-9)
    assert float(m["is/seq_masked_frac"]) == pytest.approx(0.5, abs=1e-9)


# ------------------------------------------------- agreement with OpenRLHF's PolicyLoss (v0.11 semantics)


def openrlhf_reference(
    lp, old, rollout, adv, mask, *, eps_lo, eps_hi, dual, token_level, loss_type, is_on, is_type, lo, hi
):
    """An element-by-element transcription of the OpenRLHF formulas, written with Python floats so it
    shares no code with the implementation under test."""
    rows = []
    for b in range(len(lp)):
        idx = [t for t in range(len(lp[b])) if mask[b][t]]
        if loss_type == "gspo":
            base = rollout if is_on else old
            s = math.exp(sum(lp[b][t] - base[b][t] for t in idx) / max(len(idx), 1))
            ratio = {t: s for t in idx}
        else:
            ratio = {t: math.exp(max(-20.0, min(20.0, lp[b][t] - old[b][t]))) for t in idx}
        seq_is = math.exp(sum(old[b][t] - rollout[b][t] for t in idx) / max(len(idx), 1)) if idx else 1.0
        losses = []
        for t in idx:
            s1 = ratio[t] * adv[b][t]
            s2 = min(max(ratio[t], 1 - eps_lo), 1 + eps_hi) * adv[b][t]
            loss = -min(s1, s2)
            if dual is not None and adv[b][t] < 0:
                loss = -max(min(s1, s2), dual * adv[b][t])
            if is_on and loss_type == "ppo":
                rho = math.exp(old[b][t] - rollout[b][t])
                if is_type == "tis":
                    w = min(max(rho, lo), hi)
                elif is_type == "icepop":
                    w = rho if lo <= rho <= hi else 0.0
                else:  # seq-mask-tis
                    w = rho if lo <= seq_is <= hi else 0.0
                loss *= w
            losses.append(loss)
        rows.append(losses)
    if token_level and loss_type == "ppo":
        n = sum(len(r) for r in rows)
        return sum(sum(r) for r in rows) / n
    seq = [sum(r) / len(r) for r in rows if r]
    return sum(seq) / len(seq)


CONFIGS = [
    (loss_type, dual, token_level, is_on, is_type)
    for loss_type, dual, token_level, is_on, is_type in itertools.product(
        ["ppo", "gspo"], [None, 3.0], [True, False], [False, True], ["tis", "icepop", "seq-mask-tis"]
    )
    if not (is_type != "tis" and not is_on)
]


@pytest.mark.filterwarnings("ignore:policy_loss_type=gspo")
@pytest.mark.parametrize("loss_type, dual, token_level, is_on, is_type", CONFIGS)
def test_matches_openrlhf_formulas(loss_type, dual, token_level, is_on, is_type):
    gen = torch.Generator().manual_seed(hash((loss_type, dual, token_level, is_on, is_type)) % 2**31)
    b, t = 5, 9
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
    lp = old + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.4
    rollout = old + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.5
    adv = torch.randn(b, t, generator=gen, dtype=torch.float64) * 2
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    lo, hi = 0.7, 1.6
    loss_fn = PolicyLoss(
        clip_eps_low=0.2,
        clip_eps_high=0.28,
        dual_clip=dual,
        token_level_loss=token_level,
        policy_loss_type=loss_type,
        enable_vllm_is_correction=is_on,
        vllm_is_truncated_threshold=[lo, hi],
        vllm_is_correction_type=is_type,
    )
    loss, _ = loss_fn(lp, old, adv, action_mask=mask, rollout_log_probs=rollout)
    expected = openrlhf_reference(
        lp.tolist(), old.tolist(), rollout.tolist(), adv.tolist(), mask.tolist(),
        eps_lo=0.2, eps_hi=0.28, dual=dual, token_level=token_level, loss_type=loss_type,
        is_on=is_on, is_type=is_type, lo=lo, hi=hi,
    )  # fmt: skip
    assert loss.item() == pytest.approx(expected, abs=1e-9, rel=1e-9)


# ------------------------------------------------------------------- gradients


@pytest.mark.parametrize("name", list(IS_CORRECTIONS))
def test_masked_and_filtered_tokens_get_exactly_zero_gradient(name):
    log_probs, old, adv, mask = hand_batch()
    r = torch.tensor([[0.0, math.log(27), 0.0, 0.0], [math.log(4), float("nan"), 0.0, 0.0]], dtype=torch.float64)
    old = old.clone()
    old[0, 3] = float("nan")  # junk under the mask
    loss_fn = PolicyLoss(
        enable_vllm_is_correction=True, vllm_is_truncated_threshold=band(name, (0.5, 2.5)), vllm_is_correction_type=name
    )
    loss, _ = loss_fn(log_probs, old, adv, action_mask=mask, rollout_log_probs=old - r)
    loss.backward()
    grad = log_probs.grad
    assert torch.isfinite(grad).all()
    assert (grad[~mask] == 0).all()
    assert grad[1, 1] == 0  # non-finite rollout log-prob
    weights_zero = {"tis": [], "icepop": [(0, 1), (1, 0)], "reinforce_pro": [(0, 1), (0, 2), (1, 0)]}
    for pos in weights_zero.get(name, []):
        assert grad[pos] == 0, pos


def test_is_weight_is_not_differentiated():
    """d loss / d log_probs with IS must equal w * (d loss / d log_probs without IS), w held constant."""
    log_probs, old, adv, mask = hand_batch()
    r = torch.tensor([[0.3, -0.2, 0.1, 0.0], [0.2, 0.1, 0.0, 0.0]], dtype=torch.float64)
    rollout = (old - r).requires_grad_(True)
    old_g = old.clone().requires_grad_(True)
    PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type="tis")(
        log_probs, old_g, adv, action_mask=mask, rollout_log_probs=rollout
    )[0].backward()
    assert rollout.grad is None or (rollout.grad == 0).all()
    g_is = log_probs.grad.clone()
    log_probs.grad = None
    PolicyLoss()(log_probs, old, adv, action_mask=mask)[0].backward()
    torch.testing.assert_close(g_is, torch.where(mask, r.exp(), 0) * log_probs.grad, atol=1e-12, rtol=1e-12)


# ---------------------------------------------------------------- sharding invariance


def random_batch(seed, b=6, t=7):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 2
    lp = (old + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.3).requires_grad_(True)
    rollout = old + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(b, t, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([1, 7, 3, 0, 5, 2])[:b]  # uneven lengths, one empty sequence
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return lp, old, rollout, adv, mask


@pytest.mark.parametrize("token_level", [True, False], ids=["token", "sequence"])
def test_aggregate_loss_sharding_invariance(token_level):
    lp, _, _, _, mask = random_batch(0)
    per_token = lp.square()
    n_tok, n_seq = float(mask.sum()), float((mask.sum(-1) > 0).sum())
    whole = aggregate_loss(per_token, mask, token_level)
    shards = [aggregate_loss(per_token[s], mask[s], token_level, 2, n_tok, n_seq) for s in (slice(0, 2), slice(2, 6))]
    assert (sum(shards) / 2).item() == pytest.approx(whole.item(), abs=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({}, id="ppo-token"),
        pytest.param({"token_level_loss": False}, id="ppo-seq"),
        pytest.param({"policy_loss_type": "gspo"}, id="gspo"),
        pytest.param(
            {"enable_vllm_is_correction": True, "vllm_is_correction_type": "reinforce_pro"}, id="reinforce_pro"
        ),
    ],
)
def test_policy_loss_sharding_invariance(kwargs):
    """Two data-parallel shards (dp_size=2, global counts) average to the whole batch, loss and gradient."""
    lp, old, rollout, adv, mask = random_batch(1)
    loss_fn = PolicyLoss(**kwargs)
    whole, _ = loss_fn(lp, old, adv, action_mask=mask, rollout_log_probs=rollout)
    (g_whole,) = torch.autograd.grad(whole, lp)
    n_tok, n_seq = float(mask.sum()), float((mask.sum(-1) > 0).sum())
    total, g_total = 0.0, torch.zeros_like(lp)
    for s in (slice(0, 3), slice(3, 6)):
        part, _ = loss_fn(
            lp[s], old[s], adv[s], action_mask=mask[s], rollout_log_probs=rollout[s],
            dp_size=2, batch_num_tokens=n_tok, global_batch_size=n_seq,
        )  # fmt: skip
        (g,) = torch.autograd.grad(part, lp)
        total, g_total = total + part.item() / 2, g_total + g / 2  # the DP engine averages over ranks
    assert total == pytest.approx(whole.item(), abs=1e-12)
    torch.testing.assert_close(g_total, g_whole, atol=1e-12, rtol=1e-10)


# ----------------------------------------------------------------------- properties


@st.composite
def loss_batches(draw):
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    floats = st.floats(-4.0, 0.0, allow_nan=False)
    grid = st.lists(st.lists(floats, min_size=t, max_size=t), min_size=b, max_size=b)
    old = torch.tensor(draw(grid), dtype=torch.float64)
    lp = torch.tensor(draw(grid), dtype=torch.float64)
    rollout = torch.tensor(draw(grid), dtype=torch.float64)
    adv = torch.tensor(draw(grid), dtype=torch.float64) + 2.0
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b)))
    return lp, old, rollout, adv, mask


LOSS_KINDS = st.sampled_from([{}, {"dual_clip": 2.0}, {"token_level_loss": False}])


@settings(max_examples=60, deadline=None)
@given(loss_batches(), st.sampled_from(list(IS_CORRECTIONS)), LOSS_KINDS)
def test_prop_on_policy_rollout_leaves_loss_unchanged(batch, name, kind):
    lp, old, _, adv, mask = batch
    plain, _ = PolicyLoss(**kind)(lp, old, adv, action_mask=mask)
    corrected, m = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type=name, **band_of(name), **kind)(
        lp, old, adv, action_mask=mask, rollout_log_probs=old.clone()
    )
    assert corrected.item() == pytest.approx(plain.item(), abs=1e-12)
    assert float(m["is/token_masked_frac"]) == 0.0


@pytest.mark.filterwarnings("ignore:policy_loss_type=gspo")
@settings(max_examples=60, deadline=None)
@given(loss_batches(), st.sampled_from(list(IS_CORRECTIONS)), LOSS_KINDS, st.sampled_from(["ppo", "gspo"]), st.data())
def test_prop_masked_positions_change_nothing(batch, name, kind, loss_type, data):
    lp, old, rollout, adv, mask = batch
    loss_fn = PolicyLoss(
        enable_vllm_is_correction=True,
        vllm_is_correction_type=name,
        policy_loss_type=loss_type,
        **band_of(name),
        **kind,
    )

    def run(lp, old, rollout, adv):
        lp = lp.clone().requires_grad_(True)
        loss, m = loss_fn(lp, old, adv, action_mask=mask, rollout_log_probs=rollout)
        (g,) = torch.autograd.grad(loss, lp)
        return loss, m, g

    ref = run(lp, old, rollout, adv)
    junk = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 0.0])
    n = int((~mask).sum())
    changed = []
    for x in (lp, old, rollout, adv):
        x = x.clone()
        x[~mask] = torch.tensor(data.draw(st.lists(junk, min_size=n, max_size=n)), dtype=x.dtype)
        changed.append(x)
    out = run(*changed)
    assert torch.equal(ref[0], out[0])
    assert torch.equal(ref[2], out[2])
    assert (out[2][~mask] == 0).all()
    for k in ref[1]:
        assert ref[1][k].item() == out[1][k].item(), k


@settings(max_examples=60, deadline=None)
@given(loss_batches(), st.sampled_from(list(IS_CORRECTIONS)), LOSS_KINDS, st.data())
def test_prop_nonfinite_logprobs_never_reach_loss(batch, name, kind, data):
    lp, old, rollout, adv, mask = batch
    bad = torch.tensor(data.draw(st.lists(st.booleans(), min_size=lp.numel(), max_size=lp.numel()))).view_as(lp)
    value = data.draw(st.sampled_from([float("nan"), float("inf"), -float("inf")]))
    target = data.draw(st.sampled_from(["old", "rollout"]))
    (old if target == "old" else rollout)[bad] = value
    lp = lp.clone().requires_grad_(True)
    loss, m = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type=name, **band_of(name), **kind)(
        lp, old, adv, action_mask=mask, rollout_log_probs=rollout
    )
    (g,) = torch.autograd.grad(loss, lp)
    assert torch.isfinite(loss)
    assert torch.isfinite(g).all()
    assert all(math.isfinite(float(v)) for v in m.values())


# ----------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, match",
    [
        pytest.param({"policy_loss_type": "grpo"}, "valid: ppo, gspo", id="loss-type"),
        pytest.param({"dual_clip": 1.0}, "dual_clip must be > 1.0", id="dual-clip"),
        pytest.param({"vllm_is_correction_type": "mis"}, "valid: tis, icepop", id="is-type"),
        pytest.param({"vllm_is_truncated_threshold": [5.0, 0.5]}, "0 <= low < high", id="threshold"),
    ],
)
def test_bad_constructor_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PolicyLoss(**kwargs)


def test_gspo_warns_that_the_token_correction_is_not_applied():
    with pytest.warns(UserWarning, match="'reinforce_pro' is not applied"):
        PolicyLoss(policy_loss_type="gspo", enable_vllm_is_correction=True, vllm_is_correction_type="reinforce_pro")


def test_is_without_rollout_log_probs_names_the_shape():
    lp, old, adv, mask = hand_batch()
    with pytest.raises(ValueError, match=r"rollout_log_probs.*\(2, 4\), got None"):
        PolicyLoss(enable_vllm_is_correction=True)(lp, old, adv, action_mask=mask)


def test_shape_mismatch_lists_shapes():
    lp, old, adv, mask = hand_batch()
    with pytest.raises(ValueError, match=r"old_log_probs=\(2, 3\)"):
        PolicyLoss()(lp, old[:, :3], adv, action_mask=mask)


# ----------------------------------------------------------------------- value loss


@pytest.mark.parametrize(
    "clip, expected, clip_frac",
    [
        # values [1, 2], old [0.5, 2], returns [2, 1]: clipped value 0.7 -> (1.3^2 = 1.69 vs 1), then 1 vs 1
        pytest.param(0.2, 0.5 * (1.69 + 1.0) / 2, 0.5, id="clipped"),
        pytest.param(None, 0.5 * (1.0 + 1.0) / 2, 0.0, id="unclipped"),
    ],
)
def test_value_loss_hand_computed(clip, expected, clip_frac):
    values = torch.tensor([[1.0, 2.0, 50.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.5, 2.0, 0.0]], dtype=torch.float64)
    returns = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    loss, m = ValueLoss(clip_eps=clip)(values, old, returns, action_mask=mask)
    assert loss.item() == pytest.approx(expected, abs=1e-9)
    assert float(m["critic/value_clip_frac"]) == pytest.approx(clip_frac, abs=1e-9)
    loss.backward()
    assert values.grad[0, 2] == 0


def test_the_loss_takes_its_settings_as_they_are():
    """One definition of the loss's defaults and checks (SurrogateConfig): PolicyLoss keeps the object it is
    given, the keyword form builds the same settings, and bad settings fail where they are built."""
    from reinforce_pro.algos.losses import SurrogateConfig

    settings = SurrogateConfig(enable_vllm_is_correction=True, vllm_is_correction_type="reinforce_pro")
    assert PolicyLoss(settings).settings is settings
    assert PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type="reinforce_pro").settings == settings
    assert settings.vllm_is_truncated_threshold == DEFAULT_IS_THRESHOLD
    with pytest.raises(TypeError, match="not both"):
        PolicyLoss(settings, dual_clip=3.0)
    with pytest.raises(ValueError, match="dual_clip"):
        SurrogateConfig(dual_clip=0.5)


def test_position_metrics_ride_along_with_the_is_metrics():
    from reinforce_pro.algos.is_correction import position_metrics

    gen = torch.Generator().manual_seed(0)
    lp, old = -torch.rand(3, 5, generator=gen), -torch.rand(3, 5, generator=gen)
    rollout, adv, mask = (
        old - 0.5 * torch.randn(3, 5, generator=gen),
        torch.randn(3, 5, generator=gen),
        torch.ones(3, 5),
    )
    kwargs = dict(enable_vllm_is_correction=True, vllm_is_correction_type="reinforce_pro")
    _, plain = PolicyLoss(**kwargs)(lp, old, adv, action_mask=mask, rollout_log_probs=rollout)
    loss, m = PolicyLoss(**kwargs, position_metrics=True)(lp, old, adv, action_mask=mask, rollout_log_probs=rollout)
    expected = position_metrics(old, rollout, mask, *DEFAULT_IS_THRESHOLD, adv)
    assert set(m) == set(plain) | set(expected) and "is_pos/masked/icepop/4-7" in m
    for key, stat in expected.items():
        assert m[key].item() == stat.item(), key


def test_selfcheck_passes_for_every_correction(capsys):
    """`python -m reinforce_pro.selfcheck` (every correction under a progressive drift) runs and finds nothing."""
    from reinforce_pro.selfcheck import run

    assert run() == []
    assert "seq-binary-kl" in capsys.readouterr().out
