"""studies/moe_drift.py's readings, on hand-made tensors: where a row's first flip is, and which tokens each
offset bucket and its baseline average."""

import pytest
import torch

from studies.moe_drift import around_first_flip, masked_fractions, position_rows


def test_around_the_first_flip_buckets_each_flipped_rows_tokens_by_offset_and_compares_unflipped_rows():
    nan = float("nan")
    # 3 rows x 6 response tokens x 1 layer: row 0 flips at column 2 (and 4: not the first), row 1 never,
    # row 2 has no routes at column 0 (NaN) and flips at column 1
    flips = torch.tensor([[0, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [nan, 1, 0, 0, 0, 0]]).unsqueeze(-1)
    action = torch.ones(3, 6, dtype=torch.bool)
    action[1, 5] = False  # row 1's response is one token shorter
    gap_off = torch.arange(18, dtype=torch.float32).view(3, 6)
    gap_r3 = torch.zeros(3, 6)
    out = around_first_flip(gap_off, gap_r3, flips, action)
    assert (out["rows_with_flip"], out["rows"]) == (2, 3)
    assert out["at"]["tokens"] == 2 and out["at"]["gap_off"] == pytest.approx((2 + 13) / 2)
    assert out["before"]["tokens"] == 3 and out["before"]["gap_off"] == pytest.approx((0 + 1 + 12) / 3)
    assert out["+1..3"]["tokens"] == 6 and out["+1..3"]["gap_off"] == pytest.approx((3 + 4 + 5 + 14 + 15 + 16) / 6)
    # baseline: row 1 (no flip) at the columns the bucket covers in some flipped row
    assert out["at"]["baseline_gap_off"] == pytest.approx((7 + 8) / 2)
    assert out["+1..3"]["baseline_gap_off"] == pytest.approx((8 + 9 + 10) / 3)
    assert out["+16.."]["tokens"] == 0


def test_position_rows_count_flips_per_layer_over_tokens_the_engine_routed():
    flips = torch.tensor([[[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]])
    action = torch.ones(1, 4, dtype=torch.bool)
    gap = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    rows = position_rows(gap, gap * 0, flips, action)
    assert rows["0-1"] == {"tokens": 2, "flip_frac": 0.25, "gap_off": pytest.approx(0.15), "gap_r3": 0.0}
    assert rows["2-3"]["flip_frac"] == 0.5 and rows["2-3"]["gap_off"] == pytest.approx(0.35)


def test_masked_fractions_sweep_to_the_band_nearest_two_percent():
    g = torch.Generator().manual_seed(0)
    rollout = -torch.rand(8, 50, generator=g)
    old = rollout + torch.randn(8, 50, generator=g) * 0.01  # ratios within ~1% of 1
    action = torch.ones(8, 50, dtype=torch.bool)
    out = masked_fractions(old, rollout, action, torch.tensor([1.0, -1.0] * 4))
    assert out["icepop"]["default"] == 0.0  # [0.5, 5] keeps everything
    setting, frac = out["icepop"]["nearest"]
    assert dict(out["icepop"]["sweep"])[setting] == frac and abs(frac - 0.02) <= min(
        abs(f - 0.02) for _, f in out["icepop"]["sweep"]
    )
    assert [f for _, f in out["icepop"]["sweep"]] == sorted(f for _, f in out["icepop"]["sweep"])  # tighter: more
