"""Hand-computed cases for every IS correction, plus gradient, bad-input and property checks.

The fixture batch (band [0.5, 2.0]) has three sequences chosen so the four corrections disagree:
- seq 0, mask [1 1 1 1 0], r = [0, ln 8, -ln 2, 0 | pad]: one spike that the prefix mean absorbs;
- seq 1, mask [0 1 1 1 1], r = [prompt | ln 9, 0, 0, -ln 4]: an early burst that drags the running
  mean out of the band for three tokens (reinforce_pro masks them, icepop only the burst);
- seq 2, mask [1 1 1 1 1], r = [0, NaN, 0, 0, 0]: a non-finite rollout log-prob, which breaks the prefix.
"""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reinforce_pro.algos.is_correction import IS_CORRECTIONS, NEEDS_ADVANTAGES, compute_is_weights, default_band

LOW, HIGH = 0.5, 2.0
L2, L4, L8, L9 = (math.log(x) for x in (2, 4, 8, 9))
NAN = float("nan")


def fixture_batch(dtype=torch.float64):
    r = torch.tensor(
        [
            [0.0, L8, -L2, 0.0, 123.0],  # last position is padding with junk
            [-77.0, L9, 0.0, 0.0, -L4],  # first position is a prompt token with junk
            [0.0, 0.0, 0.0, 0.0, 0.0],
        ],
        dtype=dtype,
    )
    mask = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    old = torch.full_like(r, -1.3)
    rollout = old - r
    rollout[2, 1] = NAN
    return old, rollout, mask


EXPECTED_WEIGHTS = {
    "tis": [[1, 2, 0.5, 1, 0], [0, 2, 1, 1, 0.5], [1, 0, 1, 1, 1]],
    "icepop": [[1, 0, 0.5, 1, 0], [0, 0, 1, 1, 0], [1, 0, 1, 1, 1]],
    # seq 0: g = 4^(1/4) = 1.414 in band; seq 1: g = 2.25^(1/4) = 1.225 in band; seq 2: NaN token dropped.
    "seq-mask-tis": [[1, 8, 0.5, 1, 0], [0, 9, 1, 1, 0.25], [1, 0, 1, 1, 1]],
    # prefix geometric means: seq 0 [1, 2.83, 1.59, 1.41]; seq 1 [9, 3, 2.08, 1.22]; seq 2 broken at t=1.
    "reinforce_pro": [[1, 0, 0.5, 1, 0], [0, 0, 0, 0, 0.25], [1, 0, 0, 0, 0]],
    # reinforce_pro's mask, kept ratios clamped to [0.5, 2]: 0.25 -> 0.5
    "reinforce_pro-tis": [[1, 0, 0.5, 1, 0], [0, 0, 0, 0, 0.5], [1, 0, 0, 0, 0]],
}

# 13 action tokens, 12 of them with finite log-probs.
EXPECTED_MASKED = {"tis": 1, "icepop": 4, "seq-mask-tis": 1, "reinforce_pro": 8, "reinforce_pro-tis": 8}
EXPECTED_MASKED_SEQS = {"tis": 1, "icepop": 3, "seq-mask-tis": 1, "reinforce_pro": 3, "reinforce_pro-tis": 3}
# first masked index counted from each sequence's first action token, over sequences that have one
EXPECTED_FIRST_MASKED = {
    "tis": 1.0, "icepop": 2 / 3, "seq-mask-tis": 1.0, "reinforce_pro": 2 / 3, "reinforce_pro-tis": 2 / 3,
}  # fmt: skip


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in EXPECTED_WEIGHTS])
def test_weights_hand_computed(name):
    old, rollout, mask = fixture_batch()
    weights, _ = compute_is_weights(name, old, rollout, mask, LOW, HIGH)
    torch.testing.assert_close(weights, torch.tensor(EXPECTED_WEIGHTS[name], dtype=torch.float64), atol=1e-9, rtol=0)


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in EXPECTED_WEIGHTS])
def test_metrics_hand_computed(name):
    old, rollout, mask = fixture_batch()
    weights, m = compute_is_weights(name, old, rollout, mask, LOW, HIGH)
    w = torch.tensor(EXPECTED_WEIGHTS[name], dtype=torch.float64)
    ratios = [1, 8, 0.5, 1, 9, 1, 1, 0.25, 1, 1, 1, 1]  # finite action tokens, before truncation
    expected = {
        "is/vllm_kl": -(L4 + math.log(2.25)) / 12,
        "is/ratio_mean": sum(ratios) / 12,
        "is/ratio_min": 0.25,
        "is/ratio_max": 9.0,
        "is/weight_mean": float(w.sum()) / 13,
        "is/token_masked_frac": EXPECTED_MASKED[name] / 13,
        "is/seq_masked_frac": EXPECTED_MASKED_SEQS[name] / 3,
        "is/weight_sq_mean": float(w.square().sum()) / 13,
        "is/ess": float(w.sum()) ** 2 / float(w.square().sum()) / 13,
        "is/nonfinite_tokens": 1.0,
        "is/first_masked_pos_mean": EXPECTED_FIRST_MASKED[name],
    }
    if name.startswith("reinforce_pro"):
        prefix = [1, 8**0.5, 4 ** (1 / 3), 4**0.25, 9, 3, 9 ** (1 / 3), 2.25**0.25, 1]
        expected.update({"is/prefix_is_mean": sum(prefix) / 9, "is/prefix_is_min": 1.0, "is/prefix_is_max": 9.0})
    assert set(expected) == set(m), sorted(set(expected) ^ set(m))
    for key, value in expected.items():
        assert float(m[key]) == pytest.approx(value, abs=1e-9), key


def test_no_masked_token_reports_minus_one():
    old = torch.zeros(2, 3)
    _, m = compute_is_weights("icepop", old, old.clone(), torch.ones(2, 3), LOW, HIGH)
    assert float(m["is/first_masked_pos_mean"]) == -1.0
    assert float(m["is/token_masked_frac"]) == 0.0
    assert float(m["is/ess"]) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("name", list(EXPECTED_WEIGHTS))
def test_float32_matches_float64(name):
    old, rollout, mask = fixture_batch(torch.float32)
    weights, _ = compute_is_weights(name, old, rollout, mask, LOW, HIGH)
    torch.testing.assert_close(weights, torch.tensor(EXPECTED_WEIGHTS[name], dtype=torch.float32), atol=1e-6, rtol=1e-6)


def any_weights(name, old, rollout, mask, low, high):
    """compute_is_weights for any correction: a divergence gate with its own band, a sign gate with advantages
    of both signs (alternating rows)."""
    adv = None
    if name in NEEDS_ADVANTAGES:
        adv = torch.tensor([(-1.0) ** b for b in range(old.size(0))], dtype=torch.float64)
    return compute_is_weights(name, old, rollout, mask, *default_band(name, (low, high)), advantages=adv)


@pytest.mark.parametrize("name", list(IS_CORRECTIONS))
def test_weights_carry_no_gradient(name):
    old, rollout, mask = fixture_batch()
    old.requires_grad_(True)
    rollout = rollout.detach().requires_grad_(True)
    weights, metrics = any_weights(name, old, rollout, mask, LOW, HIGH)
    assert not weights.requires_grad
    assert not any(torch.as_tensor(v.value).requires_grad for v in metrics.values())


def test_log_ratio_clamped_before_exp():
    old = torch.tensor([[0.0, 0.0]])
    rollout = torch.tensor([[-1000.0, 1000.0]])  # r = +1000 / -1000: exp overflows / underflows
    weights, m = compute_is_weights("tis", old, rollout, torch.ones(1, 2), 0.0, 1e30)
    assert torch.isfinite(weights).all()
    assert float(m["is/ratio_max"]) == pytest.approx(math.exp(20.0), rel=1e-6)
    assert float(m["is/ratio_min"]) == pytest.approx(math.exp(-20.0), rel=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        pytest.param({"correction_type": "tiss"}, "valid: tis, icepop, seq-mask-tis, reinforce_pro", id="unknown-name"),
        pytest.param({"low": 2.0, "high": 0.5}, "0 <= low < high", id="low-above-high"),
        pytest.param({"low": 1.0, "high": 1.0}, "0 <= low < high", id="low-equals-high"),
        pytest.param({"low": -0.1}, "0 <= low < high", id="negative-low"),
        pytest.param({"rollout_log_probs": torch.zeros(2, 4)}, r"rollout_log_probs=\(2, 4\)", id="shape"),
    ],
)
def test_bad_input(kwargs, match):
    args = {
        "correction_type": "tis",
        "old_log_probs": torch.zeros(2, 3),
        "rollout_log_probs": torch.zeros(2, 3),
        "action_mask": torch.ones(2, 3),
        "low": 0.5,
        "high": 5.0,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        compute_is_weights(**args)


# ---------------------------------------------------------------- properties

finite_logp = st.floats(min_value=-8.0, max_value=0.0, allow_nan=False)
junk = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(float("nan")), st.just(float("inf")))


@st.composite
def batches(draw, max_b=4, max_t=7):
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))
    cells = st.lists(st.lists(finite_logp, min_size=t, max_size=t), min_size=b, max_size=b)
    old = torch.tensor(draw(cells), dtype=torch.float64)
    rollout = torch.tensor(draw(cells), dtype=torch.float64)
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b)))
    low = draw(st.floats(0.0, 1.0))
    high = draw(st.floats(1.0, 10.0).filter(lambda h: h > low))
    return old, rollout, mask, low, high


@settings(max_examples=80, deadline=None)
@given(batches(), st.sampled_from(list(IS_CORRECTIONS)))
def test_prop_on_policy_gives_weight_one(batch, name):
    old, _, mask, low, high = batch
    weights, m = any_weights(name, old, old.clone(), mask, min(low, 0.999), max(high, 1.001))
    assert torch.equal(weights, mask.to(weights.dtype))
    assert float(m["is/token_masked_frac"]) == 0.0


@settings(max_examples=80, deadline=None)
@given(batches(), st.sampled_from(list(IS_CORRECTIONS)), st.data())
def test_prop_masked_positions_do_not_matter(batch, name, data):
    old, rollout, mask, low, high = batch
    w1, m1 = any_weights(name, old, rollout, mask, low, high)
    old2, rollout2 = old.clone(), rollout.clone()
    n_off = int((~mask).sum())
    old2[~mask] = torch.tensor(data.draw(st.lists(junk, min_size=n_off, max_size=n_off)), dtype=old.dtype)
    rollout2[~mask] = torch.tensor(data.draw(st.lists(junk, min_size=n_off, max_size=n_off)), dtype=old.dtype)
    w2, m2 = any_weights(name, old2, rollout2, mask, low, high)
    assert torch.equal(w1, w2)
    assert (w1[~mask] == 0).all()
    for k in m1:
        assert m1[k].item() == m2[k].item(), k  # value, weight and reduction alike


@settings(max_examples=80, deadline=None)
@given(batches(), st.sampled_from(list(IS_CORRECTIONS)), st.data())
def test_prop_nonfinite_never_leaks(batch, name, data):
    old, rollout, mask, low, high = batch
    bad = torch.tensor(
        data.draw(st.lists(st.booleans(), min_size=old.numel(), max_size=old.numel())), dtype=torch.bool
    ).view_as(old)
    values = data.draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))
    target = data.draw(st.sampled_from(["old", "rollout"]))
    (old if target == "old" else rollout)[bad] = values
    weights, metrics = any_weights(name, old, rollout, mask, low, high)
    assert torch.isfinite(weights).all()
    assert (weights[bad] == 0).all()
    assert all(math.isfinite(float(v)) for v in metrics.values())
    assert float(metrics["is/nonfinite_tokens"]) == int((bad & mask).sum())
    if name in ("reinforce_pro", "minpro", "ctpo", "cppo"):  # the prefix-level corrections
        broken = torch.cumsum((bad & mask).int(), dim=-1) > 0
        assert (weights[broken] == 0).all()


@settings(max_examples=80, deadline=None)
@given(batches())
def test_prop_reinforce_pro_equals_icepop_on_first_action_token(batch):
    old, rollout, mask, low, high = batch
    w_pro, _ = compute_is_weights("reinforce_pro", old, rollout, mask, low, high)
    w_ice, _ = compute_is_weights("icepop", old, rollout, mask, low, high)
    for b in range(mask.size(0)):
        idx = torch.nonzero(mask[b]).flatten()
        if len(idx):
            assert w_pro[b, idx[0]] == w_ice[b, idx[0]]


@settings(max_examples=60, deadline=None)
@given(st.floats(1.0, 6.0), st.integers(2, 40), st.integers(0, 3), st.floats(1.5, 5.0))
def test_prop_early_burst_masks_until_mean_returns(burst_over, length, n_prompt, high):
    """A first action token with r = D > ln(high), then on-policy tokens (r = 0): the running mean D/(t+1)
    stays above ln(high) for t < D/ln(high) - 1, so reinforce_pro masks exactly those tokens; icepop
    masks only the burst."""
    d = math.log(high) + burst_over
    r = torch.zeros(1, n_prompt + length, dtype=torch.float64)
    r[0, n_prompt] = d
    mask = torch.zeros_like(r, dtype=torch.bool)
    mask[0, n_prompt:] = True
    old = torch.full_like(r, -2.0)
    rollout = old - r
    w_pro, _ = compute_is_weights("reinforce_pro", old, rollout, mask, 0.0, high)
    w_ice, _ = compute_is_weights("icepop", old, rollout, mask, 0.0, high)
    t = torch.arange(length, dtype=torch.float64)
    prefix_out = d / (t + 1) > math.log(high)
    boundary = (d / (t + 1) - math.log(high)).abs() < 1e-9
    pro_masked = w_pro[0, n_prompt:] == 0
    assert torch.equal(pro_masked[~boundary], prefix_out[~boundary])
    ice_masked = w_ice[0, n_prompt:] == 0
    assert ice_masked[0] and not ice_masked[1:].any()


# ---------------------------------------------------------------------------------------------- positions
def _drift_late():
    """Row 0 drifts by log ratio 4 from response position 3 on; row 1 (first action token in column 1) not."""
    old = torch.tensor([[0.0, 0, 0, 4, 4, 4], [0, 0, 0, 0, 0, 0]], dtype=torch.float64) - 5.0
    rollout = torch.full_like(old, -5.0)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0]], dtype=torch.bool)
    return old, rollout, mask


@pytest.mark.parametrize(
    "correction, masked, first",
    [
        # band [0.5, 5]: icepop drops every token with ratio e^4; reinforce_pro only where the prefix
        # mean of the log ratios exceeds log 5 (position 5: 12 / 6 = 2); seq-mask-tis the whole of row 0
        pytest.param("tis", (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), id="tis"),
        pytest.param("icepop", (0.0, 0.25, 1.0), (0.0, 1.0, 0.0), id="icepop"),
        pytest.param("reinforce_pro", (0.0, 0.0, 0.5), (0.0, 0.0, 1.0), id="reinforce_pro"),
        pytest.param("seq-mask-tis", (0.5, 0.5, 1.0), (1.0, 0.0, 0.0), id="seq-mask-tis"),
    ],
)
def test_position_metrics_hand_computed(correction, masked, first):
    from reinforce_pro.algos.is_correction import position_metrics

    m = position_metrics(*_drift_late(), 0.5, 5.0)
    buckets = ("0-1", "2-3", "4-7")  # responses of 6 tokens reach three buckets
    assert [float(m[f"is_pos/abs_log_ratio/{b}"]) for b in buckets] == pytest.approx([0.0, 1.0, 4.0])
    assert [float(m[f"is_pos/masked/{correction}/{b}"]) for b in buckets] == pytest.approx(list(masked))
    assert [float(m[f"is_pos/first_masked/{correction}/{b}"]) for b in buckets] == pytest.approx(list(first))
    assert {k.split("/")[-1] for k in m} == set(buckets)


def test_position_metrics_merge_over_parts_like_the_whole_batch():
    from reinforce_pro.algos.is_correction import position_metrics
    from reinforce_pro.algos.stats import reduce_stats

    gen = torch.Generator().manual_seed(3)
    old = -torch.rand(9, 40, generator=gen, dtype=torch.float64) * 3
    rollout = old - torch.randn(9, 40, generator=gen, dtype=torch.float64).cumsum(-1) * 0.3
    mask = torch.arange(40).expand(9, 40) < torch.tensor([40, 3, 17, 33, 8, 40, 25, 1, 12]).unsqueeze(-1)
    whole = reduce_stats([position_metrics(old, rollout, mask, 0.5, 2.0)])
    parts = reduce_stats(
        [position_metrics(old[r], rollout[r], mask[r], 0.5, 2.0) for r in ([0, 1, 2], [3], [4, 5, 6, 7, 8])]
    )
    assert set(whole) == set(parts) and "is_pos/abs_log_ratio/32-63" in whole
    for key, value in whole.items():
        assert parts[key] == pytest.approx(value, abs=1e-12), key


def test_reinforce_pro_tis_bounds_an_isolated_spike_that_reinforce_pro_keeps():
    """Ten tokens at ratio 1, then one at 30: the prefix mean 30^(1/11) = 1.36 stays in [0.5, 5]."""
    rollout = torch.zeros(1, 11, dtype=torch.float64)
    old = rollout.clone()
    old[0, 10] = math.log(30.0)
    mask = torch.ones(1, 11, dtype=torch.bool)
    raw, _ = compute_is_weights("reinforce_pro", old, rollout, mask, 0.5, 5.0)
    clamped, _ = compute_is_weights("reinforce_pro-tis", old, rollout, mask, 0.5, 5.0)
    assert float(raw[0, 10]) == pytest.approx(30.0) and float(clamped[0, 10]) == pytest.approx(5.0)
    assert torch.equal(raw[0, :10], clamped[0, :10])


# ---------------------------------------------------------------------------------------------- a user's correction

USER_ICEPOP = """
from reinforce_pro.algos.stats import mean_stat

def correction(inp):
    # icepop written by a user: keep tokens whose ratio is in the band, and log the kept fraction
    keep = inp.valid & (inp.ratio >= inp.low) & (inp.ratio <= inp.high)
    return inp.ratio, keep, {"is/my_kept_frac": mean_stat(keep.float(), inp.action_mask)}
"""


def test_a_users_correction_from_a_file_is_applied_like_a_builtin(tmp_path):
    """`--vllm_is_correction_path` (slime's custom-function pattern) takes the built-ins' signature; a
    user's icepop gives the built-in icepop's weights and metrics, plus its own."""
    from reinforce_pro.algos.is_correction import load_user_correction
    from reinforce_pro.algos.losses import PolicyLoss

    path = tmp_path / "my_icepop.py"
    path.write_text(USER_ICEPOP)
    mine = load_user_correction(str(path))
    old, rollout, mask = fixture_batch()
    w_user, m_user = compute_is_weights(mine, old, rollout, mask, LOW, HIGH)
    w_icepop, m_icepop = compute_is_weights("icepop", old, rollout, mask, LOW, HIGH)
    torch.testing.assert_close(w_user, w_icepop, rtol=0, atol=0)
    assert {k: float(v) for k, v in m_icepop.items()} == {k: float(m_user[k]) for k in m_icepop}
    assert float(m_user["is/my_kept_frac"]) == pytest.approx(1 - float(m_icepop["is/token_masked_frac"]))
    loss = PolicyLoss(
        enable_vllm_is_correction=True, vllm_is_correction_path=str(path), vllm_is_truncated_threshold=(LOW, HIGH)
    )
    ref = PolicyLoss(
        enable_vllm_is_correction=True, vllm_is_correction_type="icepop", vllm_is_truncated_threshold=(LOW, HIGH)
    )
    lp = old + 0.05
    adv = torch.randn(old.shape, dtype=old.dtype, generator=torch.Generator().manual_seed(0))
    assert float(loss(lp, old, adv, mask, rollout)[0]) == float(ref(lp, old, adv, mask, rollout)[0])


@pytest.mark.parametrize(
    "body, message",
    [
        pytest.param("x = 1\n", "define correction(inp", id="no-function"),
        pytest.param("raise ImportError('nope')\n", "importing it failed: ImportError: nope", id="import-fails"),
        pytest.param(
            "def correction(inp):\n    return inp.ratio\n", "must return (weights, keep, metrics)", id="one-value"
        ),
        pytest.param(
            "def correction(inp):\n    return inp.ratio[:, :1], inp.valid, {}\n",
            "weights must be a float tensor of shape (2, 3)",
            id="shape",
        ),
        pytest.param(
            "def correction(inp):\n    return inp.ratio, inp.ratio, {}\n", "keep must be a bool tensor", id="keep-dtype"
        ),
        pytest.param(
            "def correction(inp):\n    return inp.ratio, inp.valid, {'a': 1.0}\n",
            "metrics must be a dict of",
            id="metrics",
        ),
        pytest.param("def correction(inp):\n    return 1 / 0\n", "correction raised ZeroDivisionError", id="raises"),
    ],
)
def test_a_broken_user_correction_is_one_error_at_start_up(tmp_path, body, message):
    from reinforce_pro.algos.losses import SurrogateConfig

    path = tmp_path / "broken.py"
    path.write_text(body)
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        SurrogateConfig(enable_vllm_is_correction=True, vllm_is_correction_path=str(path))
    assert str(e.value).startswith(f"--vllm_is_correction_path {path}") and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="needs --enable_vllm_is_correction"):
        SurrogateConfig(vllm_is_correction_path=str(path))
