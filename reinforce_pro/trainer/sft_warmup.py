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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in tqdm(range(steps), desc="warm start (SFT)", leave=False):
        batch = rng.sample(examples, min(batch_size, len(examples)))
        ids, labels = _encode_batch(tok, batch)
        out = model(input_ids=ids, attention_mask=(ids != tok.pad_token_id).long(), labels=labels)
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
    from reinforce_pro.data.arithmetic import arithmetic_records

    examples = [{"prompt": r["input"], "label": r["label"]} for r in arithmetic_records(4096, seed=seed + 1)]
    return sft_warm_start(model_dir, out_dir, examples, steps=steps, seed=seed)


def _encode_batch(tok, batch: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    rows, targets = [], []
    for item in batch:
        prompt = [tok.bos_token_id] + tok(item["prompt"], add_special_tokens=False)["input_ids"]
        answer = tok(str(item["label"]), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append(prompt + answer)
        targets.append([-100] * len(prompt) + answer)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (r, t) in enumerate(zip(rows, targets, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(t)] = torch.tensor(t)
    return ids, labels
