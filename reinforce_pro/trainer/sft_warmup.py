"""A short supervised warm start, used by the embedded default before RL.

A freshly initialised model never samples a correct answer, so RL would have nothing to reinforce.
A few hundred teacher-forced steps on the built-in task get it partly right; RL then has to do the rest.
The loss covers the answer tokens and <eos> only (the prompt is given).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

CHECK_EVERY = 50  # warm-start steps between two checks of a stop condition (a greedy pass over a few prompts)


def sft_warm_start(
    model_dir: str | Path,
    out_dir: str | Path,
    examples: list[dict],
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    stop: Callable[[torch.nn.Module, object], bool] | None = None,
) -> dict:
    """Train `model_dir` on {"prompt", "label"} examples for `steps` steps; save to `out_dir`. Returns stats.
    `stop(model, tokenizer)`, asked every CHECK_EVERY steps (or its `every`), ends the warm start early when it
    returns True."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    encode = lambda batch: _encode_batch(tok, batch)  # noqa: E731
    return _fit(model_dir, out_dir, examples, encode, steps, batch_size, lr, seed, stop)


@dataclass
class AccuracyStop:
    """A warm start's stop condition: true once `accuracy(model, tokenizer)` reaches `target`, asked every
    `every` steps (a task whose accuracy jumps within 50 steps asks more often, to stop nearer its target).
    Every check's accuracy is kept; the last one is reported as sft/stop_accuracy."""

    accuracy: Callable[[torch.nn.Module, object], float]
    target: float
    every: int = CHECK_EVERY
    checks: list[float] = field(default_factory=list)

    def __call__(self, model: torch.nn.Module, tok) -> bool:
        self.checks.append(self.accuracy(model, tok))
        return self.checks[-1] >= self.target


def greedy_accuracy(model, tok, records: list[dict], score: Callable[[str, str], float], max_new_tokens: int) -> float:
    """The mean score of `model`'s greedy answers to {"input", "label"} records, prompted as the warm start
    trains (<bos> then the prompt); the model is left in train mode."""
    model.eval()
    prompts = [[tok.bos_token_id] + tok(r["input"], add_special_tokens=False)["input_ids"] for r in records]
    generations = greedy_sampler(model, tok)(prompts, {"max_tokens": max_new_tokens})
    model.train()
    answers = tok.batch_decode([g.token_ids for g in generations], skip_special_tokens=True)
    return sum(score(a, r["label"]) for a, r in zip(answers, records, strict=True)) / len(records)


def sft_on_sequences(
    model_dir: str | Path,
    out_dir: str | Path,
    sequences: list[tuple[list[int], list[bool]]],
    steps: int,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    stop: Callable[[torch.nn.Module, object], bool] | None = None,
) -> dict:
    """As sft_warm_start, on token sequences whose loss covers the positions marked True: for multi-turn
    demonstrations laid out as the agent runner lays out episodes (model turns trained, environment turns
    context only)."""
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(model_dir).pad_token_id
    encode = lambda batch: _pad_sequences(batch, pad)  # noqa: E731
    return _fit(model_dir, out_dir, sequences, encode, steps, batch_size, lr, seed, stop)


def greedy_sampler(model, tok) -> Callable[[list[list[int]], dict], list]:
    """The agent runner's `sample` (agents/runner.py) on a model being trained: greedy continuations of token-id
    contexts, up to the setting's max_tokens, ended by <eos> (log-probs are not computed: 0.0 each). For a stop
    condition that plays whole episodes; the caller puts the model in eval mode."""
    from reinforce_pro.rollout.vllm_engine import Generation

    def sample(contexts: list[list[int]], sampling: dict) -> list:
        width = max(map(len, contexts))
        ids = torch.tensor([[tok.pad_token_id] * (width - len(c)) + c for c in contexts])  # left-padded
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=sampling["max_tokens"], pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)  # fmt: skip
        generations = []
        for row in out[:, width:].tolist():
            ended = tok.eos_token_id in row
            row = row[: row.index(tok.eos_token_id) + 1] if ended else row
            generations.append(Generation(row, [0.0] * len(row), "stop" if ended else "length"))
        return generations

    return sample


def _fit(model_dir, out_dir, items: list, encode, steps: int, batch_size: int, lr: float, seed: int, stop=None) -> dict:
    """`steps` AdamW steps on random batches of `items` (encode(batch) -> ids, attention mask, labels: -100 where
    untrained), fewer when `stop(model, tokenizer)` says so at a check."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses, every = [], getattr(stop, "every", CHECK_EVERY)
    for step in tqdm(range(1, steps + 1), desc="warm start (SFT)", leave=False):
        ids, attention, labels = encode(rng.sample(items, min(batch_size, len(items))))
        out = model(input_ids=ids, attention_mask=attention, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(out.loss.item())
        if stop is not None and step % every == 0 and stop(model, tok):
            break
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    last = sum(losses[-10:]) / len(losses[-10:])
    stats = {"sft/steps": len(losses), "sft/loss_first": losses[0], "sft/loss_last": last}
    if getattr(stop, "checks", None):
        stats["sft/stop_accuracy"] = stop.checks[-1]
    return stats


def arithmetic_warm_start(model_dir: str | Path, out_dir: str | Path, steps: int, seed: int) -> dict:
    """The embedded default's warm start: `steps` SFT steps on 4096 built-in additions (drawn with seed + 1,
    so they differ from the RL prompts drawn with `seed`)."""
    return embedded_warm_start("arithmetic", model_dir, out_dir, steps, seed)


def embedded_warm_start(task_name: str, model_dir, out_dir, steps: int, seed: int, target: float = 0.0,
                        max_new_tokens: int = 64, lr: float = 3e-3) -> dict:  # fmt: skip
    """The warm start of an embedded task (data.EMBEDDED_TASKS): up to `steps` SFT steps on its examples, drawn
    with seed + 1 so they differ from the RL prompts drawn with `seed`; with `target` > 0 it stops at the first
    check where the greedy accuracy on 64 training prompts (drawn with seed + 2) reaches `target`."""
    from reinforce_pro.data import EMBEDDED_TASKS

    task = EMBEDDED_TASKS[task_name]()
    examples = task.warm_start(task.warm_start_examples, seed + 1)
    stop = None
    if target > 0:
        probe = task.records(64, seed + 2)
        stop = AccuracyStop(lambda model, tok: greedy_accuracy(model, tok, probe, task.score, max_new_tokens), target)
    return sft_warm_start(model_dir, out_dir, examples, steps=steps, seed=seed, stop=stop, lr=lr)


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
