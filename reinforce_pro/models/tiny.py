"""The built-in tiny model: a Qwen2-architecture causal LM and a character-level tokenizer, created
locally (nothing is downloaded) and saved as an ordinary HF model directory that vLLM, DeepSpeed and
transformers all load like any other. `--embedded_model moe` builds its mixture-of-experts twin instead, a
Qwen3-MoE (`build_tiny_moe_model`), for routing replay (models/routing.py).

The tokenizer maps each printable ASCII character and the newline to one token, plus <pad>, <bos>, <eos>,
<unk>. Its chat template renders a conversation as "<bos>user: ...\nassistant: " (an assistant turn of the
history closed by <eos>), so that `--apply_chat_template` and multi-turn chat agents work on the built-in model.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
# Printable ASCII (space included), then the newline, spelled as GPT-2's byte-level alphabet spells them: space
# is "Ġ", newline "Ċ", the others themselves. transformers loads a directory whose config says qwen2 with
# Qwen2Tokenizer whatever tokenizer_config.json says, and Qwen2Tokenizer byte-level-encodes its input: a
# vocabulary of plain " " would lose every space once the model is saved and loaded (ids: space 4, newline 99).
CHARS = ["Ġ" if c == 32 else chr(c) for c in range(32, 127)] + ["Ċ"]
# An assistant turn in the history ends with <eos>, where the model's own turn ended: a multi-turn agent's next
# prompt then extends the ids the engine sampled (agents/trajectory.py), as Qwen's <|im_end|> does. Declared tools
# come first, as one short line of signatures ("tools: add(a, b)": every character is a position of a 256-long
# context); an assistant's tool calls follow its text in the chatml family's tags, which the endpoint parses
# (agents/tools.py): <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>. A conversation
# without tools renders as it always has.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if tools %}tools: {% for t in tools %}{{ t['function']['name'] }}("
    "{{ (t['function']['parameters']['properties'] or {}) | list | join(', ') }}){% if not loop.last %}, {% endif %}"
    "{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
    "{% for c in m['tool_calls'] or [] %}<tool_call>"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}</tool_call>{% endfor %}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tokenizer():
    """A character-level PreTrainedTokenizerFast over printable ASCII and the newline; the same tokenizer as
    the one transformers (Qwen2Tokenizer) and vLLM load from a saved model directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    # BPE with no merges splits each piece into its characters; the byte-level pre-tokenizer maps " " to "Ġ"
    # and "\n" to "Ċ" (without splitting into words), the byte-level decoder maps them back.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    path: str | Path,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    max_positions: int = 256,
    seed: int = 0,
) -> Path:
    """Create (or reuse) a tiny Qwen2 model + tokenizer at `path`; returns the path.

    Reuses the directory if it already holds a model with the same configuration, so repeated runs and
    tests do not rebuild it.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    shape = _shape(tokenizer, hidden_size, num_layers, num_heads, num_kv_heads, max_positions)
    config = Qwen2Config(**shape, intermediate_size=intermediate_size)
    return _save_new(Path(path), config, Qwen2ForCausalLM, tokenizer, seed, ("hidden_size", "num_hidden_layers"))


def build_tiny_moe_model(
    path: str | Path,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    num_experts: int = 8,
    experts_per_token: int = 2,
    expert_size: int = 96,
    max_positions: int = 256,
    seed: int = 0,
) -> Path:
    """Create (or reuse) the tiny model's mixture-of-experts twin at `path`: a Qwen3-MoE with every layer's MLP
    a router over `num_experts` experts, `experts_per_token` chosen per token (the top-k of the router's softmax,
    renormalised, as Qwen3-30B-A3B does), the same tokenizer and chat template. The experts are smaller than the
    dense model's MLP (96 against 384) so that the two active per token cost about half of it. head_dim is 32:
    vLLM's CPU attention kernel refuses 16."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = build_tokenizer()
    shape = _shape(tokenizer, hidden_size, num_layers, num_heads, num_kv_heads, max_positions)
    config = Qwen3MoeConfig(
        **shape,
        intermediate_size=4 * expert_size,  # unused: every layer is sparse (mlp_only_layers empty)
        moe_intermediate_size=expert_size,
        head_dim=hidden_size // num_heads,
        num_experts=num_experts,
        num_experts_per_tok=experts_per_token,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    same = ("hidden_size", "num_hidden_layers", "num_experts", "num_experts_per_tok")
    return _save_new(Path(path), config, Qwen3MoeForCausalLM, tokenizer, seed, same)


VOCAB_SIZE = 128  # len(vocab) = 99, rounded up for friendlier kernels


def _shape(tokenizer, hidden_size: int, layers: int, heads: int, kv_heads: int, positions: int) -> dict:
    """The config settings the dense model and its MoE twin share: sizes, a tied head, the tokenizer's ids."""
    return dict(
        vocab_size=VOCAB_SIZE, hidden_size=hidden_size, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, max_position_embeddings=positions, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32",
    )  # fmt: skip


def _save_new(path: Path, config, model_cls, tokenizer, seed: int, same: tuple[str, ...]) -> Path:
    """Save a freshly initialised `model_cls(config)` and the tokenizer at `path`, unless `path` already holds a
    model of the same architecture whose `same` settings and vocabulary agree (repeated runs and tests reuse it)."""
    import torch
    from transformers import AutoConfig

    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        existing = AutoConfig.from_pretrained(path)
        if existing.model_type == config.model_type and all(
            getattr(existing, k, None) == getattr(config, k) for k in (*same, "vocab_size")
        ):
            saved = path / "chat_template.jinja"
            if not saved.exists() or saved.read_text() != tokenizer.chat_template:
                tokenizer.save_pretrained(path)  # a directory from before the template last changed
            return path
    torch.manual_seed(seed)
    model = model_cls(config)
    path.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a 1-shard bar on stderr for a model built in a second is noise
    try:
        model.save_pretrained(path, safe_serialization=True)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(path)
    return path
