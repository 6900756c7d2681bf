"""LoRA (models/lora.py): the merged weights the engines get compute what the peft model computes, and only
the adapters train. No Ray here; the end-to-end LoRA runs are in test_e2e.py."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from reinforce_pro.models.lora import LoraAdapterConfig, apply_lora, merged_state_dict  # noqa: E402
from reinforce_pro.models.tiny import build_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("lora") / "tiny", seed=0)


def load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize(
    "targets, adapted",
    [
        pytest.param(["all-linear"], 14, id="all-linear"),  # 2 layers x (q k v o gate up down); not lm_head
        pytest.param(["q_proj", "v_proj"], 4, id="q-v"),
        pytest.param(["q_proj"], 2, id="one-module"),  # a lone name must not become a regex over full names
    ],
)
def test_merged_weights_compute_what_the_adapter_model_computes(tiny, targets, adapted):
    base = {k: v.clone() for k, v in load(tiny).state_dict().items()}
    model = apply_lora(load(tiny), LoraAdapterConfig(rank=4, alpha=8, target_modules=targets))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * adapted
    # B starts at zero: the merged weights are the base weights, bit for bit, under the same names
    merged = merged_state_dict(model)
    assert merged.keys() == base.keys()
    assert all(torch.equal(merged[k], base[k]) for k in base)
    # after an update of A and B the merged model gives the adapter model's logits
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    merged = merged_state_dict(model)
    changed = sorted(k for k in base if not torch.equal(merged[k], base[k]))
    assert len(changed) == adapted and all(k.endswith("proj.weight") for k in changed)
    plain = load(tiny)
    plain.load_state_dict(merged)
    ids = torch.randint(3, 30, (3, 12), generator=gen)
    with torch.no_grad():
        want, got = model(input_ids=ids).logits, plain(input_ids=ids).logits
    assert (want - got).abs().max().item() < 1e-5
    assert (want - load(tiny)(input_ids=ids).logits).abs().max().item() > 1e-2  # the update does change outputs
    # the parameters were not touched by merging (no merge / unmerge round trip)
    again = merged_state_dict(model)
    assert all(torch.equal(again[k], merged[k]) for k in merged)
    from peft import get_peft_model_state_dict

    assert all(".lora_" in k for k in get_peft_model_state_dict(model))  # what the adapter directory holds
