"""--fp32_lm_head: the trainer's head computes as vLLM's head_dtype float32 does, and the flag reaches both sides."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def test_a_bf16_models_head_computes_in_fp32_like_vllms(tmp_path):
    """After install_fp32_head and a cast to bf16 (what DeepSpeed does after it), the logits are float32 and equal
    F.linear of the bf16 hidden states and the bf16 weight, both cast to fp32 (vLLM's LogitsProcessor); the plain
    bf16 head rounds them."""
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.fp32_head import install_fp32_head
    from reinforce_pro.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "m", hidden_size=64, num_layers=1, intermediate_size=128)
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(torch.bfloat16).eval()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    head = install_fp32_head(model)
    model = model.to(torch.bfloat16).eval()
    assert head.weight.dtype == torch.bfloat16  # stored in the model's dtype, as vLLM keeps it
    ids = torch.randint(3, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state
        logits = model(input_ids=ids).logits
        rounded = plain(input_ids=ids).logits
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, F.linear(hidden.float(), head.weight.float()), rtol=0, atol=0)
    assert (rounded.float() - logits).abs().max() > 1e-4  # the bf16 head is what it replaces


def test_a_head_that_is_not_linear_is_refused():
    from reinforce_pro.models.fp32_head import HeadNotOverridable, install_fp32_head

    class NoLinearHead(torch.nn.Module):
        def get_output_embeddings(self):
            return torch.nn.Identity()

    with pytest.raises(HeadNotOverridable, match="not a linear head"):
        install_fp32_head(NoLinearHead())


def test_the_flag_sets_both_sides_and_refuses_a_quantized_engine():
    from reinforce_pro.cli.args import build_parser, first_problem
    from reinforce_pro.cli.flags_to_config import run_config
    from reinforce_pro.rollout.vllm_engine import llm_kwargs

    parser = build_parser()
    for spelling in ("--fp32_lm_head", "--cast_lm_head_to_fp32"):
        args = parser.parse_args([spelling])
        assert first_problem(args, parser) is None
        cfg = run_config(args)
        assert cfg.forward.fp32_lm_head and cfg.engines.config.fp32_head
        assert llm_kwargs(cfg.engines.config, 0, False)["hf_overrides"] == {"head_dtype": "float32"}
    cfg = run_config(parser.parse_args([]))
    assert not cfg.forward.fp32_lm_head and "hf_overrides" not in llm_kwargs(cfg.engines.config, 0, False)
    args = parser.parse_args(["--fp32_lm_head", "--vllm_quantization", "fp8_per_channel", "--vllm_dtype", "bfloat16"])
    assert "the engine's side would be left out" in first_problem(args, parser)
