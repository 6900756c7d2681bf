"""A short supervised warm start, used by the embedded default before RL.

A freshly initialised model never samples a correct answer, so RL would have nothing to reinforce.
A few hundred teacher-forced steps on the built-in task get it partly right; RL then has to do the rest.
The loss covers the answer tokens and <eos> only (the prompt is given).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from tqdm import tqdm


def sft_warm_start(
    model_dir: str | Path,
    out_dir: str | Path,
    examples: list[dict],
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
) -> dict:
    """Train `model_dir` on {"prompt", "label"} examples for `steps` steps; save to `out_dir`. Returns stats."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    encode = lambda batch: _encode_batch(tok, batch)  # noqa: E731
    return _fit(model_dir, out_dir, examples, encode, steps, batch_size, lr, seed)


def sft_on_sequences(
    model_dir: str | Path,
    out_dir: str | Path,
    sequences: list[tuple[list[int], list[bool]]],
    steps: int,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
) -> dict:
    """As sft_warm_start, on token sequences whose loss covers the positions marked True: for multi-turn
    demonstrations laid out as the agent runner lays out episodes (model turns trained, environment turns
    context only)."""
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(model_dir).pad_token_id
    return _fit(model_dir, out_dir, sequences, lambda batch: _pad_sequences(batch, pad), steps, batch_size, lr, seed)


def _fit(model_dir, out_dir, items: list, encode, steps: int, batch_size: int, lr: float, seed: int) -> dict:
    """`steps` AdamW steps on random batches of `items` (encode(batch) -> ids, attention mask, labels: -100 where
    untrained)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in tqdm(range(steps), desc="warm start (SFT)", leave=False):
        ids, attention, labels = encode(rng.sample(items, min(batch_size, len(items))))
        out = model(input_ids=ids, attention_mask=attention, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(out.loss.item())
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return {"sft/steps": steps, "sft/loss_first": losses[0], "sft/loss_last": sum(losses[-10:]) / len(losses[-10:])}


def arithmetic_warm_start(model_dir: str | Path, out_dir: str | Path, steps: int, seed: int) -> dict:
    """The embedded default's warm start: `steps` SFT steps on 4096 built-in additions (drawn with seed + 1,
    so they differ from the RL prompts drawn with `seed`)."""
    from reinforce_pro.data import EMBEDDED_TASKS

    examples = EMBEDDED_TASKS["arithmetic"]().warm_start(4096, seed + 1)
    return sft_warm_start(model_dir, out_dir, examples, steps=steps, seed=seed)


def _encode_batch(tok, batch: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = []
    for item in batch:
        prompt = [tok.bos_token_id] + tok(item["prompt"], add_special_tokens=False)["input_ids"]
        answer = tok(str(item["label"]), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((prompt + answer, [False] * len(prompt) + [True] * len(answer)))
    return _pad_sequences(rows, tok.pad_token_id)


def _pad_sequences(rows: list[tuple[list[int], list[bool]]], pad: int) -> tuple[torch.Tensor, ...]:
    """(ids, attention mask, labels) of right-padded rows; labels are -100 off the trained positions."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (r, trained) in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        attention[i, : len(r)] = 1
        labels[i, : len(r)] = torch.where(torch.tensor(trained), torch.tensor(r), -100)
    return ids, attention, labels
