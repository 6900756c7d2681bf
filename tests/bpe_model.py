"""A small stand-in for a real pretrained checkpoint, made locally: a 2-layer Llama with untied embeddings and
a byte-level BPE tokenizer trained here, with a ChatML chat template, EOS `<|im_end|>`, no BOS and no pad
token (as SmolLM2's and many Llama-family tokenizers ship). Everything the built-in char model never
exercises: merges, special tokens inside the template, a missing pad token, untied lm_head."""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [f"What is {a} + {b}? The answer is {a + b}." for a in range(40) for b in range(0, 40, 3)]


def build_bpe_llama(path: str | Path, vocab_size: int = 320, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    if (path / "config.json").exists():
        return path
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", padding_side="left")
    fast.chat_template = CHATML
    assert fast.pad_token_id is None and fast.bos_token_id is None
    # head_dim 32: vLLM's CPU attention kernels refuse 16
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
        eos_token_id=fast.eos_token_id, bos_token_id=None, pad_token_id=None, torch_dtype="float32",
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    fast.save_pretrained(path)
    return path
