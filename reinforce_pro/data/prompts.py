"""Prompt data: a jsonl file or a local HF dataset directory -> prompt texts and labels.

Never reaches the network: a path that does not exist locally is an error, not a hub id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class DataError(ValueError):
    """Bad prompt data; the message names the file (and line) and what is wrong."""


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None


def read_jsonl(path: Path) -> list[dict]:
    records = []
    for lineno, line in enumerate(_text(path).split("\n"), start=1):  # not splitlines: U+2028 is valid in JSON
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
        records.append(record)
    return records


def read_json(path: Path) -> list[dict]:
    """A .json file holding one list of objects."""
    try:
        data = json.loads(_text(path))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
    for i, record in enumerate(data):
        if not isinstance(record, dict):
            raise DataError(f"{path}: item {i} is a {type(record).__name__}, expected a JSON object")
    return data


def load_records(path: str | Path, split: str = "train") -> list[dict]:
    """Records from a .jsonl/.json file, a directory of them, or an HF `save_to_disk` directory."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory (datasets are read from local paths only)")
    if path.is_file():
        return read_json(path) if path.suffix == ".json" else read_jsonl(path)
    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
        import datasets

        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"{path}: no split {split!r}; splits: {', '.join(ds)}")
            ds = ds[split]
        return [dict(r) for r in ds]
    files = sorted(path.glob(f"{split}*.jsonl")) or sorted(path.glob("*.jsonl"))
    if not files:
        raise DataError(f"{path}: no {split}*.jsonl / *.jsonl files and not an HF save_to_disk dataset")
    return [r for f in files for r in read_jsonl(f)]


def parse_mixture(paths: str, probs: str | None) -> list[tuple[str, float]]:
    """`--prompt_data a.jsonl,b.jsonl --prompt_data_probs 0.7,0.3` (OpenRLHF's comma-separated form) ->
    [(path, probability)], the probabilities normalised; equal shares when `probs` is None."""
    names = [p.strip() for p in paths.split(",") if p.strip()]
    if probs is None:
        return [(n, 1 / len(names)) for n in names]
    try:
        weights = [float(w) for w in probs.split(",")]
    except ValueError:
        raise DataError(f"--prompt_data_probs {probs}: expected comma-separated numbers") from None
    if len(weights) != len(names):
        raise DataError(f"--prompt_data_probs gives {len(weights)} probabilities for {len(names)} datasets")
    if any(not 0 < w < float("inf") for w in weights):  # also NaN
        raise DataError(f"--prompt_data_probs {probs}: every probability must be > 0 and finite")
    return [(n, w / sum(weights)) for n, w in zip(names, weights, strict=True)]


def mix(datasets: list[list[dict]], probs: list[float], count: int, seed: int) -> list[dict]:
    """Up to `count` records, each drawn from dataset i with probability probs[i], each dataset's records in
    their order and none twice; a dataset that runs out leaves the draw (the others' shares grow). The same
    seed gives the same mixture."""
    import random

    rng = random.Random(seed)
    taken = [0] * len(datasets)
    out = []
    while len(out) < count:
        live = [i for i, d in enumerate(datasets) if taken[i] < len(d)]
        if not live:
            break
        i = rng.choices(live, weights=[probs[j] for j in live])[0]
        out.append(datasets[i][taken[i]])
        taken[i] += 1
    return out


def load_prompt_records(paths: str, probs: str | None, split: str, max_samples: int, seed: int) -> list[dict]:
    """--prompt_data (one path, or several comma-separated and mixed by --prompt_data_probs), cut to
    --max_samples."""
    mixture = parse_mixture(paths, probs)
    if len(mixture) == 1:
        return load_records(mixture[0][0], split)[:max_samples]
    datasets = [load_records(path, split) for path, _ in mixture]
    return mix(datasets, [p for _, p in mixture], max_samples, seed)


@dataclass
class PromptConfig:
    input_key: str = "input"
    label_key: str | None = None
    input_template: str | None = None  # e.g. "Question: {}\nAnswer:" (OpenRLHF's --input_template)
    apply_chat_template: bool = False


def build_prompts(records: list[dict], spec: PromptConfig, tokenizer=None, source: str = "data") -> list[dict]:
    """records -> [{"prompt": text, "label": label or None}] following OpenRLHF's --input_key,
    --label_key, --input_template and --apply_chat_template."""
    out = []
    for i, record in enumerate(records):
        if spec.input_key not in record:
            raise DataError(f"{source}: record {i} has no input key {spec.input_key!r} (keys: {sorted(record)})")
        text = record[spec.input_key]
        if spec.apply_chat_template:
            messages = text if isinstance(text, list) else [{"role": "user", "content": text}]
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        elif spec.input_template:
            text = spec.input_template.format(text)
        label = None
        if spec.label_key is not None:
            if spec.label_key not in record:
                raise DataError(f"{source}: record {i} has no label key {spec.label_key!r}")
            label = record[spec.label_key]
        out.append({"prompt": text, "label": label})
    return out
