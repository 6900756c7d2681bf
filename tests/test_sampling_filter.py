"""The engine's sampling filters replayed on the trainer's logits (models/sampling_filter.py): hand-computed
supports, vLLM's own top-k / top-p code as the reference, the renormalised log-probs and their gradient, the
sampled token kept when it falls outside, the minimum length, and the closed form of what goes wrong without
the replay (the ratio equals the kept mass; TRL's reported bug)."""

from __future__ import annotations

import math

import pytest
import torch

from reinforce_pro.models.logprobs import response_log_probs, token_log_probs
from reinforce_pro.models.sampling_filter import SamplingFilter, apply_filter, kept_support, with_engine_stop_ids


def test_top_p_keeps_the_hand_computed_nucleus():
    # probs of [3, 2, 1, 0]: 0.6439, 0.2369, 0.0871, 0.0321; ascending mass 0.0321, 0.1192, 0.3561, 1
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    assert kept_support(logits, SamplingFilter(top_p=0.8)).tolist() == [[True, True, False, False]]
    assert kept_support(logits, SamplingFilter(top_p=0.9)).tolist() == [[True, True, True, False]]
    assert kept_support(logits, SamplingFilter(top_p=0.5)).tolist() == [[True, False, False, False]]
    assert kept_support(logits, SamplingFilter(top_p=1e-6)).tolist() == [[True, False, False, False]]  # one stays


def test_top_k_keeps_ties_at_the_kth_logit_and_min_p_is_relative_to_the_top():
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]])
    assert kept_support(logits, SamplingFilter(top_k=2)).tolist() == [[False, True, True, True, False]]
    assert kept_support(logits, SamplingFilter(top_k=5)).all()  # k >= V: off
    # p = softmax: 0.0758, 0.5601, 0.2060, 0.2060, 0.0279 (sum 1.0758 of exp / e^3...); min_p 0.3 x 0.5601 = 0.168
    assert kept_support(logits, SamplingFilter(min_p=0.3)).tolist() == [[False, True, True, True, False]]
    assert kept_support(logits, SamplingFilter(min_p=0.4)).tolist() == [[False, True, False, False, False]]


@pytest.mark.parametrize(
    "top_k, top_p",
    [
        pytest.param(5, 1.0, id="top-k"),
        pytest.param(-1, 0.8, id="top-p"),
        pytest.param(20, 0.7, id="both"),
        pytest.param(1, 0.9, id="top-1-with-top-p"),
    ],
)
def test_the_support_is_vllms_own(top_k, top_p):
    """vLLM's CPU sampler (apply_top_k_top_p_pytorch, what its processed log-probs come from) is the reference:
    the same tokens removed at every position, ties included (quantised logits make many)."""
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, 300, generator=gen) * 3).round(decimals=1)  # many ties
    rows = logits.size(0)
    k = torch.full((rows,), top_k if top_k > 0 else logits.size(1), dtype=torch.long)
    p = torch.full((rows,), top_p) if top_p < 1 else None
    theirs = ops.apply_top_k_top_p_pytorch(logits.clone(), k if top_k > 0 else None, p, allow_cpu_sync=True)
    mine = kept_support(logits, SamplingFilter(top_k=top_k, top_p=top_p))
    assert torch.equal(mine, torch.isfinite(theirs))
    assert 0 < mine.sum(-1).min() and mine.sum(-1).max() < logits.size(1)  # the filter did remove tokens
    if top_k == 1:
        assert (mine.sum(-1) <= 2).all()  # the top logit (or a tie of two) alone


def test_filtered_log_probs_are_renormalised_over_the_support_with_gradient_on_it_only():
    logits = torch.tensor([[[3.0, 2.0, 1.0, 0.0], [0.0, 0.5, 4.0, 1.0]]], dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([[1, 2]])
    lp, entropy = token_log_probs(logits, targets, 1.0, True, SamplingFilter(top_p=0.8))  # scored in float32
    e = [math.exp(x) for x in (3.0, 2.0)]
    assert lp[0, 0].item() == pytest.approx(math.log(e[1] / sum(e)), abs=1e-6)
    # second row: probs 0.0321, 0.0529, 0.8650, 0.0479 -> the top token alone reaches 0.8
    assert lp[0, 1].item() == pytest.approx(0.0, abs=1e-6)
    q = [v / sum(e) for v in e]
    assert entropy[0, 0].item() == pytest.approx(-sum(x * math.log(x) for x in q), abs=1e-6)
    assert entropy[0, 1].item() == pytest.approx(0.0, abs=1e-6)
    (lp.sum() + entropy.sum()).backward()
    grad = logits.grad[0]
    assert torch.isfinite(grad).all()
    assert grad[0, 2:].abs().max() == 0 and grad[1].abs().max() == 0  # nothing flows to removed tokens
    # d/dz0 of log q1 + H(q), q = softmax over the kept two: -q0 - q0 (log q0 + H)
    assert grad[0, 0].item() == pytest.approx(-q[0] - q[0] * (math.log(q[0]) + entropy[0, 0].item()), abs=1e-6)


def test_the_same_log_probs_with_and_without_the_autograd_free_path():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 7, 50, generator=gen, dtype=torch.float64)
    targets = logits.argmax(-1)  # the most likely token is in every support
    filt = SamplingFilter(top_k=10, top_p=0.9)
    fast, _ = token_log_probs(logits, targets, 0.7, False, filt)
    slow, _ = token_log_probs(logits, targets, 0.7, True, filt)
    scaled = logits / 0.7
    masked = scaled.masked_fill(~kept_support(scaled.reshape(-1, 50), filt).reshape(3, 7, 50), -math.inf)
    expected = masked.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert (expected > scaled.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1) + 1e-3).all()
    assert torch.allclose(fast.double(), expected, atol=1e-5, rtol=0)
    assert torch.allclose(slow.double(), expected, atol=1e-5, rtol=0)


def test_a_sampled_token_outside_the_trainers_support_stays_in_it_and_is_flagged():
    """A bf16 engine can sample a token just outside the trainer's fp32 nucleus: its log-prob is then taken
    over the support plus that token (never log 0 = -inf, which would NaN the loss), and flagged."""
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    masked, outside = apply_filter(logits, torch.tensor([2]), SamplingFilter(top_p=0.8))
    assert outside.tolist() == [True]
    assert torch.isfinite(masked[0, :3]).all() and masked[0, 3] == -math.inf
    lp, _ = token_log_probs(logits, torch.tensor([2]), 1.0, False, SamplingFilter(top_p=0.8))
    assert lp.item() == pytest.approx(1.0 - math.log(math.exp(3) + math.exp(2) + math.exp(1)), abs=1e-6)
    _, inside = apply_filter(logits, torch.tensor([0]), SamplingFilter(top_p=0.8))
    assert inside.tolist() == [False]


def test_a_minimum_length_hides_the_stop_ids_before_it_only():
    logits = torch.zeros(1, 4, 5)  # uniform over 5 tokens at each of 4 response positions
    filt = SamplingFilter(min_tokens=2, stop_token_ids=(0, 3))
    lp, _ = token_log_probs(logits, torch.tensor([[1, 2, 0, 4]]), 1.0, False, filt)
    assert lp[0].tolist() == pytest.approx([math.log(1 / 3)] * 2 + [math.log(1 / 5)] * 2, abs=1e-6)
    flat = torch.zeros(3, 5)  # (N, V) logits need their positions
    with pytest.raises(ValueError, match="needs each position's index"):
        kept_support(flat, filt)
    assert kept_support(flat, filt, torch.tensor([3, 1, 0])).sum(-1).tolist() == [5, 3, 3]
    assert not SamplingFilter(min_tokens=2).active  # no stop ids known: nothing hidden


def test_without_the_replay_the_ratio_is_the_kept_mass():
    """TRL's reported failure, in closed form: the engine's log-prob is log p - log S (S the kept mass), the
    full-softmax trainer's is log p, so every ratio is S; with the replay it is exactly 1."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(8, 40, generator=gen, dtype=torch.float64)
    targets = logits.argmax(-1)
    filt = SamplingFilter(top_k=5)
    keep = kept_support(logits, filt)
    mass = (logits.softmax(-1) * keep).sum(-1)
    engine = logits.masked_fill(~keep, -math.inf).log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    full, _ = token_log_probs(logits, targets)
    replayed, _ = token_log_probs(logits, targets, sampling_filter=filt)
    assert torch.allclose((full.double() - engine).exp(), mass, atol=1e-5, rtol=0) and mass.max() < 0.9
    assert torch.allclose(replayed.double(), engine, atol=1e-5, rtol=0)


def test_packed_and_padded_forwards_replay_the_minimum_length_at_the_same_positions(tmp_path):
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    filt = with_engine_stop_ids(SamplingFilter(top_k=7, min_tokens=3), str(model_dir))
    assert filt.stop_token_ids  # the tiny tokenizer's <eos>
    seq = torch.tensor([[0, 0, 1, 5, 6, 7, 8, 9, 10], [1, 4, 5, 6, 7, 8, 9, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        padded, _ = response_log_probs(model, seq, mask, 5, 1.0, sampling_filter=filt)
        packed, _ = response_log_probs(model, seq, mask, 5, 1.0, packed=True, sampling_filter=filt)
        plain, _ = response_log_probs(model, seq, mask, 5, 1.0)
    real = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    assert torch.allclose(padded[real], packed[real], atol=1e-5, rtol=0)
    assert (padded[real] > plain[real] + 1e-6).all()  # the support was narrowed at every position


def test_the_tokens_outside_the_trainers_filter_reach_the_policys_old_log_prob_pass(tmp_path):
    """batched_log_probs (the policy's old-log-prob pass) hands back, aligned with the log-probs, which sampled
    tokens the trainer's filter would have removed: the same positions on the padded and the packed forward."""
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.tiny import build_tiny_model
    from reinforce_pro.workers.base import batched_log_probs

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m"), dtype=torch.float32).eval()
    seq = torch.tensor([[0, 0, 1, 5, 6, 7, 8, 9, 10], [1, 4, 5, 6, 7, 8, 9, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0, 0]])
    filt = SamplingFilter(top_k=50)  # half the vocabulary: some of these tokens in it, some not
    with torch.no_grad():
        logits = model(seq, attention_mask=mask).logits[:, -6:-1]
    want = ~kept_support(logits.reshape(-1, logits.size(-1)), filt).gather(-1, seq[:, -5:].reshape(-1, 1))
    want = want.reshape(2, 5) & torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    for packed in (False, True):
        outside = []
        with torch.no_grad():
            lp = batched_log_probs(model, seq, mask, 5, 1.0, micro=1, packed=packed, sampling_filter=filt,
                                   outside=outside)  # fmt: skip
        real = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
        assert outside[0].shape == lp.shape and outside[0][real].bool().tolist() == want[real].tolist()
        assert 0 < int(want.sum()) < int(real.sum()) and torch.isfinite(lp[real]).all()
    none = []
    batched_log_probs(model, seq, mask, 5, 1.0, micro=2, outside=none)
    assert none == []  # no filter replayed: nothing to report


def test_the_start_of_run_line_tells_rounding_noise_from_a_real_difference():
    from reinforce_pro.trainer.experience_builder import agreement_line

    def gap(mean):
        return {"rollout/logprob_abs_diff_mean": mean, "rollout/logprob_abs_diff_p99": 3 * mean,
                "rollout/logprob_abs_diff_max": 10 * mean}  # fmt: skip

    fp32 = agreement_line(gap(2e-7), "float32", "fp32", None)
    assert (
        fp32.startswith("[agreement] step 1, engine float32 vs trainer fp32") and "rounding noise (up to 1e-04" in fp32
    )
    assert "rounding noise (up to 5e-02" in agreement_line(gap(1e-2), "bfloat16", "fp32", None)
    # the kept mass of an unreplayed top-p 0.8: 0.07 is no fp32 rounding, nor bf16's beyond its bound
    assert "above the 1e-04 rounding explains" in agreement_line(gap(0.07), "float32", "fp32", None)
    assert "above the 5e-02" in agreement_line(gap(0.07), "bfloat16", "bf16", None)
    assert "quantised engine" in agreement_line(gap(0.07), "bfloat16", "fp32", "fp8_per_channel")
    assert "\n" not in fp32
