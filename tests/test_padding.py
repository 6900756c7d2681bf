"""Padding columns skipped in training (Experience.trim_padding) and mini-batches grouped by length: the same
log-probs, gradients and loss as the padded batch, up to the order of float additions."""

from __future__ import annotations

import pytest
import torch

from reinforce_pro.experience import Experience, pad_actions, padding_bounds
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
