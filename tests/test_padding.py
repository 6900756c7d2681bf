"""Padding columns skipped in training (Experience.trim_padding) and mini-batches grouped by length: the same
log-probs, gradients and loss as the padded batch, up to the order of float additions."""

from __future__ import annotations

import pytest
import torch

from reinforce_pro.experience import (
    Experience,
    budget_chunks,
    pad_actions,
    padding_bounds,
    split_by_tokens,
    split_experience,
)
from reinforce_pro.models.logprobs import action_log_probs, forward_logits
from reinforce_pro.trainer.ppo_trainer import length_grouped


def batch(prompt_lens, response_lens, p_len=8, t_len=12, vocab=50) -> Experience:
    rows = len(prompt_lens)
    seq, mask = torch.zeros(rows, p_len + t_len, dtype=torch.long), torch.zeros(rows, p_len + t_len, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        seq[i, p_len - p : p_len + r] = torch.randint(3, vocab, (p + r,), generator=gen)
        mask[i, p_len - p : p_len + r] = 1
    per_token = torch.randn(rows, t_len, generator=gen)
    return Experience(
        sequences=seq, attention_mask=mask, action_mask=mask[:, p_len:].bool(), old_log_probs=per_token.clone(),
        rollout_log_probs=per_token.clone(), advantages=per_token.clone(), returns=per_token.clone(),
        rewards=torch.ones(rows), info={"x": torch.arange(rows)},
    )  # fmt: skip


def test_bounds_and_shapes():
    exp = batch([3, 5], [4, 7])  # prompts of 3 and 5 in 8 columns, responses of 4 and 7 in 12
    assert padding_bounds(exp.attention_mask, exp.num_actions) == (3, 7)
    trimmed = exp.trim_padding()
    assert trimmed.sequences.shape == (2, 5 + 7) and trimmed.num_actions == 7
    assert torch.equal(trimmed.advantages, exp.advantages[:, :7]) and torch.equal(trimmed.info["x"], exp.info["x"])
    assert torch.equal(trimmed.sequences[trimmed.attention_mask.bool()], exp.sequences[exp.attention_mask.bool()])
    full = batch([8, 1], [12, 1])
    assert full.trim_padding() is full  # nothing to cut
    assert padding_bounds(batch([2], [0]).attention_mask, 12) == (6, 1)  # an empty response keeps one column


def test_trimmed_log_probs_and_gradients_match_the_padded_batch(tmp_path):
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.tiny import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m"), dtype=torch.float32)
    exp = batch([3, 6, 2], [5, 9, 2], vocab=model.config.vocab_size)

    def log_probs_and_grad(e: Experience):
        model.zero_grad()
        lp, _ = action_log_probs(forward_logits(model, e.sequences, e.attention_mask), e.sequences, e.num_actions)
        lp = pad_actions(lp, exp.num_actions) * exp.action_mask
        lp.sum().backward()
        return lp.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])

    (lp_full, g_full), (lp_trim, g_trim) = log_probs_and_grad(exp), log_probs_and_grad(exp.trim_padding())
    torch.testing.assert_close(lp_trim, lp_full, atol=2e-6, rtol=0)
    torch.testing.assert_close(g_trim, g_full, atol=1e-5, rtol=1e-4)
    assert lp_full.abs().sum() > 0


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_length_grouping_is_a_permutation_with_sorted_balanced_shards(ranks):
    lengths = torch.tensor([9, 1, 7, 3, 8, 2, 6, 4, 5, 10, 11])
    rows = torch.randperm(11, generator=torch.Generator().manual_seed(1))
    grouped = length_grouped(rows, lengths, ranks)
    assert sorted(grouped.tolist()) == sorted(rows.tolist())
    shards = torch.tensor_split(grouped, ranks)  # what ActorGroup.shards gives each rank
    for shard in shards:
        assert torch.equal(lengths[shard], lengths[shard].sort().values)  # micro-batches of similar length
    totals = [int(lengths[s].sum()) for s in shards]
    assert max(totals) - min(totals) <= lengths.max()  # interleaved: no rank gets all the long rows


def test_budget_chunks_respect_the_budget():
    lengths = [2, 3, 3, 5, 8, 9, 20]
    assert budget_chunks(lengths, 16) == [3, 2, 1, 1]  # 3 x 3, 2 x 8, then 9 and 20 (over budget) alone
    assert budget_chunks(lengths, 1000) == [7] and budget_chunks([], 16) == []
    # packed (--packing_samples), a chunk costs its real tokens: 2+3+3+5 = 13, then 8 and 9 (17 > 16) apart
    assert budget_chunks(lengths, 16, packed=True) == [4, 1, 1, 1]
    assert budget_chunks([4, 4, 4, 4], 16, packed=True) == [4]
    assert budget_chunks([4, 4, 4, 4], 15, packed=True) == [3, 1]


def test_split_by_tokens_packed_balances_real_tokens():
    exp = batch([1] * 5, [1, 1, 1, 1, 4], t_len=6)  # real lengths 2 2 2 2 5
    packed, padded = split_by_tokens(exp, 2, packed=True), split_by_tokens(exp, 2)
    # packed: 2+2+2 = 6 and 2+5 = 7 real tokens; padded: 4 rows x 2 = 8 slots, then 1 x 5
    assert [len(c) for c in packed] == [3, 2] and [int(c.attention_mask.sum()) for c in packed] == [6, 7]
    assert [len(c) for c in padded] == [4, 1]


@pytest.mark.parametrize("parts", [1, 2, 3, 5, 7])
def test_split_by_tokens_gives_exactly_parts_of_similar_cost(parts):
    exp = batch([2] * 7, [1, 2, 2, 4, 6, 7, 10], t_len=10)
    chunks = split_by_tokens(exp, parts)
    assert len(chunks) == parts and all(len(c) for c in chunks)
    assert torch.equal(torch.cat([c.sequences for c in chunks]), exp.sequences)  # consecutive, in order
    if parts == 3:
        costs = [len(c) * int(c.attention_mask.sum(-1).max()) for c in chunks]
        assert max(costs) <= 24  # vs 7 x 12 = 84 for one chunk: the budget search balanced them


def test_the_loss_does_not_depend_on_how_the_mini_batch_is_cut():
    """--use_dynamic_batch changes only the micro-batch boundaries: with the global token count, the summed
    loss (and so the gradient) is the same for a fixed count and a token budget."""
    from reinforce_pro.algos.losses import PolicyLoss

    exp = batch([3, 6, 2, 5, 4, 1], [5, 9, 2, 12, 7, 3])
    log_probs = exp.old_log_probs + 0.1 * torch.randn(
        exp.old_log_probs.shape, generator=torch.Generator().manual_seed(3)
    )
    loss_fn = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type="reinforce_pro")
    tokens, seqs = float(exp.action_mask.sum()), float(len(exp))

    def summed(chunks: list[Experience]) -> torch.Tensor:
        total, start = torch.zeros(()), 0
        for c in chunks:  # consecutive chunks: rows start..start+len(c) of exp
            lp, start = log_probs[start : start + len(c)], start + len(c)
            c = c.trim_padding()
            loss, _ = loss_fn(
                lp[:, : c.num_actions], c.old_log_probs, c.advantages, action_mask=c.action_mask,
                rollout_log_probs=c.rollout_log_probs, batch_num_tokens=tokens, global_batch_size=seqs,
            )  # fmt: skip
            total = total + loss
        return total

    fixed = summed(split_experience(exp, 3))
    budget = summed(split_by_tokens(exp, 4))
    torch.testing.assert_close(budget, fixed, atol=1e-6, rtol=1e-6)
    assert fixed.abs() > 0


def test_the_log_prob_forward_builds_no_graph(tmp_path):
    """The old / reference log-prob forward runs without autograd (a graph would hold every activation)."""
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.tiny import build_tiny_model
    from reinforce_pro.workers.base import batched_log_probs

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m"), dtype=torch.float32)
    exp = batch([3, 6, 2], [5, 9, 2], vocab=model.config.vocab_size)
    for max_tokens in (None, 20):
        lp = batched_log_probs(model, exp.sequences, exp.attention_mask, exp.num_actions, 1.0, 2, max_tokens)
        assert lp.shape == exp.action_mask.shape and not lp.requires_grad


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_log_probs_backward_is_autograds(temperature):
    """The hand-written gradient of log_softmax(logits)[target] (models/logprobs._TokenLogProbs) against
    autograd's through logsumexp and gather: same values and gradients, on a slice of a larger logits
    tensor as the trainer passes it, with a weighted and with a plain sum as the loss."""
    from reinforce_pro.models.logprobs import _TokenLogProbs, token_log_probs

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=gen) * 4
    targets = torch.randint(0, 50, (3, 5), generator=gen)
    weights = torch.randn(3, 5, generator=gen)
    for loss_of in (lambda lp: (lp * weights).sum(), lambda lp: lp.sum()):
        ours_in, ref_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        ours, _ = token_log_probs(ours_in[:, 1:6], targets, temperature)
        scaled = ref_in[:, 1:6] / temperature
        ref = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
        loss_of(ours).backward()
        loss_of(ref).backward()
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)
        torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=0, atol=1e-6)
    double = logits[:1, :2, :9].double().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: _TokenLogProbs.apply(x, targets[:1, :2] % 9), (double,))
