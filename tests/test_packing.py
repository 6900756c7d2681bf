"""--packing_samples: the padding-free forward gives the padded forward's log-probs, entropies, values and
gradients (models/packing.py)."""

import pytest
import torch

from reinforce_pro.models.logprobs import response_log_probs
from reinforce_pro.models.packing import pack
from reinforce_pro.models.tiny import build_tiny_model
from reinforce_pro.models.varlen_attention import load_name

PROMPT, RESPONSE = 10, 8
PROMPT_LENS = [2, 10, 3, 7, 1, 9]
RESPONSE_LENS = [1, 8, 2, 1, 3, 8]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("packing") / "tiny", seed=0))


def mixed_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts and right-padded responses of very different lengths, like a rollout batch."""
    torch.manual_seed(0)
    seq = torch.randint(4, 90, (len(PROMPT_LENS), PROMPT + RESPONSE))
    mask = torch.ones_like(seq)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        mask[i, : PROMPT - p] = 0
        mask[i, PROMPT + r :] = 0
    return seq * mask, mask


def test_pack_puts_sequences_back_to_back_first_fit_decreasing():
    seq = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 1], [0, 2, 3, 0]])
    mask = (seq > 0).long()
    packed = pack(seq, mask)
    # lengths 2, 4, 2 -> bins of 4: [row 1] [row 0 + row 2]
    assert packed.input_ids.tolist() == [[7, 8, 9, 1], [5, 6, 2, 3]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 0, 1]]
    assert packed.index.tolist() == [[-1, -1, 4, 5], [0, 1, 2, 3], [-1, 6, 7, -1]]


def test_a_bin_tail_is_a_filler_sequence_of_its_own():
    seq = torch.tensor([[4, 5, 6], [7, 0, 0]])
    packed = pack(seq, (seq > 0).long())
    assert packed.input_ids.tolist() == [[4, 5, 6], [7, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2], [0, 0, 1]]  # the filler restarts at 0


@pytest.mark.parametrize("attn", ["sdpa", "eager", "sdpa_varlen"])
def test_packed_log_probs_entropy_and_gradients_equal_the_padded_ones(tiny_dir, attn):
    """sdpa and eager pack into bins; sdpa_varlen (the CPU trainer's choice under --packing_samples) packs the
    whole batch into one row and attends per sequence."""
    from transformers import AutoModelForCausalLM

    seq, mask = mixed_batch()
    assert pack(seq, mask).input_ids.size(0) < seq.size(0)  # several sequences share a bin
    action_mask = mask[:, -RESPONSE:].bool()
    results = []
    for packed in (False, True):
        load_as = load_name("sdpa", packing_samples=True) if attn == "sdpa_varlen" else attn
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32, attn_implementation=load_as)
        lp, ent = response_log_probs(model, seq, mask, RESPONSE, 0.7, with_entropy=True, packed=packed)
        ((lp + 0.1 * ent) * action_mask).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((lp.detach(), ent.detach(), grads))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    assert (lp0 - lp1)[action_mask].abs().max() < 1e-5
    assert (ent0 - ent1)[action_mask].abs().max() < 1e-5
    assert (lp1[~action_mask] == 0).all()
    assert (g0 - g1).abs().max() < 1e-5 * max(1.0, g0.abs().max().item())


def test_without_the_position_restarts_the_sequences_would_see_each_other(tiny_dir, monkeypatch):
    """The check above can fail: packing the same bins with positions that run on (one long sequence per
    bin) changes the log-probs of every sequence that is not first in its bin."""
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models import packing

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32, attn_implementation="sdpa")
    seq, mask = mixed_batch()
    good, _ = response_log_probs(model, seq, mask, RESPONSE, packed=True)
    real_pack = packing.pack

    def leaky_pack(*a, **kw):
        p = real_pack(*a, **kw)
        p.position_ids = torch.arange(p.position_ids.size(1)).expand_as(p.position_ids).clone()
        return p

    monkeypatch.setattr(packing, "pack", leaky_pack)
    leaky, _ = response_log_probs(model, seq, mask, RESPONSE, packed=True)
    assert (good - leaky)[mask[:, -RESPONSE:].bool()].abs().max() > 1e-2


def test_packed_values_equal_the_padded_ones(tiny_dir):
    """The packed critic loads sdpa as sdpa_varlen: one row, attention per sequence."""
    from reinforce_pro.models.packing import attention_kernel
    from reinforce_pro.models.value import ValueModel

    seq, mask = mixed_batch()
    padded = ValueModel(tiny_dir, attn_implementation="sdpa")
    torch.nn.init.normal_(padded.head.weight)
    packed = ValueModel(tiny_dir, attn_implementation="sdpa", packed=True)
    assert attention_kernel(packed.backbone) == "sdpa_varlen"
    packed.load_state_dict(padded.state_dict())
    action_mask = mask[:, -RESPONSE:].bool()
    v0, v1 = padded(seq, mask, RESPONSE), packed(seq, mask, RESPONSE)
    assert v0.abs()[action_mask].min() > 0  # the head is not zero: the comparison means something
    assert (v0 - v1)[action_mask].abs().max() < 1e-5


def test_batched_log_probs_packed_in_chunks(tiny_dir):
    from transformers import AutoModelForCausalLM

    from reinforce_pro.workers.base import batched_log_probs

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32, attn_implementation="sdpa")
    seq, mask = mixed_batch()
    padded = batched_log_probs(model, seq, mask, RESPONSE, 1.0, micro=4)
    packed = batched_log_probs(model, seq, mask, RESPONSE, 1.0, micro=4, packed=True)
    action_mask = mask[:, -RESPONSE:].bool()
    assert (padded - packed)[action_mask].abs().max() < 1e-5


class NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no logits_to_keep (older or custom models): every position is computed."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, use_cache, attention_mask=None):
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache
        )


def test_the_lm_head_runs_on_the_response_only_and_gives_the_full_forwards_log_probs_and_gradients(tiny_dir):
    """The padded forward asks for the logits at the num_actions positions that predict the response (HF's
    logits_to_keep, as indices): the same log-probs and gradients as slicing the full (B, S, V) logits, for an
    HF model, a PEFT model and a model without the argument."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.logprobs import accepts_logits_to_keep, action_log_probs, forward_logits

    seq, mask = mixed_batch()
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32),
                          LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))  # fmt: skip
    assert accepts_logits_to_keep(model) and accepts_logits_to_keep(lora)
    assert not accepts_logits_to_keep(NoLogitsToKeep(model))
    with torch.no_grad():
        kept, every = forward_logits(model, seq, mask, predicting=RESPONSE), forward_logits(model, seq, mask)
    assert kept.shape == (len(seq), RESPONSE, 128)  # the head ran on the predicting positions alone
    torch.testing.assert_close(kept, every[:, -RESPONSE - 1 : -1], rtol=0, atol=1e-5)
    for m in (model, lora, NoLogitsToKeep(model)):
        m.zero_grad()
        full, _ = action_log_probs(forward_logits(m, seq, mask), seq, RESPONSE, 0.7)
        full.sum().backward()
        want = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        m.zero_grad()
        lp, _ = response_log_probs(m, seq, mask, RESPONSE, 0.7)
        lp.sum().backward()
        torch.testing.assert_close(lp, full, rtol=0, atol=1e-6)
        assert want and all(torch.allclose(p.grad, want[n], atol=1e-6) for n, p in m.named_parameters() if n in want)


def test_the_packed_forward_runs_the_lm_head_on_the_predicting_columns_only(tiny_dir):
    """--packing_samples: the LM head sees only the packed columns where some bin predicts a response token
    (HF's logits_to_keep as indices), and the log-probs and gradients equal a head over every position."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    seq, mask = mixed_batch()
    packed = pack(seq, mask)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32),
                          LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))  # fmt: skip
    action_mask = mask[:, -RESPONSE:].bool()
    for m in (model, lora):
        head_rows: list = []
        hook = m.get_output_embeddings().register_forward_hook(
            lambda _m, i, _o, rows=head_rows: rows.append(i[0].shape[:2])
        )
        results = []
        for forward in (m, NoLogitsToKeep(m)):
            m.zero_grad()
            lp, _ = response_log_probs(forward, seq, mask, RESPONSE, 0.7, packed=True)
            (lp * action_mask).sum().backward()
            grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
            results.append((lp.detach(), grads))
        hook.remove()
        (lp0, g0), (lp1, g1) = results
        bins, width = packed.input_ids.shape
        assert head_rows[1] == (bins, width)  # the fallback: every position
        assert head_rows[0][0] == bins and head_rows[0][1] < width  # the prompt-only columns dropped out
        torch.testing.assert_close(lp0[action_mask], lp1[action_mask], rtol=0, atol=1e-6)
        assert g0.keys() == g1.keys() and all(torch.allclose(g0[n], g1[n], atol=1e-6) for n in g0)


def test_varlen_attention_packs_one_row_and_runs_the_head_on_the_response_tokens_only(tiny_dir):
    """Under sdpa_varlen the packed forward is one row of every real token, its attention sees each sequence
    alone (per-sequence SDPA), and the LM head runs on exactly the positions that predict a real response
    token."""
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models import packing

    seq, mask = mixed_batch()
    model = AutoModelForCausalLM.from_pretrained(
        tiny_dir, dtype=torch.float32, attn_implementation=load_name("sdpa", True)
    )
    rows, shapes = [], []
    model.get_output_embeddings().register_forward_hook(lambda _m, i, _o: rows.append(tuple(i[0].shape[:2])))
    model.model.register_forward_hook(lambda _m, _i, o: shapes.append(tuple(o.last_hidden_state.shape[:2])))
    response_log_probs(model, seq, mask, RESPONSE, packed=True)
    action_mask = mask[:, -RESPONSE:].bool()
    assert shapes == [(1, int(mask.sum()))]  # one row, no bin tails
    assert rows == [(1, int(action_mask.sum()))]
    assert packing.attention_kernel(model) == "sdpa_varlen"


def test_without_the_sequence_boundaries_varlen_attention_would_mix_the_sequences(tiny_dir, monkeypatch):
    """The sdpa_varlen check above can fail: one causal segment over the whole row (the boundaries lost) changes
    the log-probs of every sequence after the first."""
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models import packing

    model = AutoModelForCausalLM.from_pretrained(
        tiny_dir, dtype=torch.float32, attn_implementation=load_name("sdpa", True)
    )
    seq, mask = mixed_batch()
    good, _ = response_log_probs(model, seq, mask, RESPONSE, packed=True)
    monkeypatch.setattr(packing, "segments", lambda position_ids: [(0, position_ids.size(1))])
    mixed, _ = response_log_probs(model, seq, mask, RESPONSE, packed=True)
    assert (good - mixed)[mask[:, -RESPONSE:].bool()].abs().max() > 1e-2
