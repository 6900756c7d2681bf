"""Search episodes written out for a supervised warm start: the token layout the agent runner produces.

A freshly initialised model never writes a well-formed `<search>` tag, so RL would have nothing to reinforce
(as for the embedded default's additions). A demonstration of a train question is the episode a competent
searcher would have: the question, `<search>home of Zorvik</search>` (a model turn, trained, ended by EOS),
the service's real answer to that query (an environment turn, context only), and for two-hop questions a second
search for the bridge entity the first answer names, then `<answer>...</answer>`. The retrieved blocks come
from the same BM25 index and format as the agent's, so the model learns to read what it will be shown.

    python -m reinforce_pro.search.demonstrations --kb data/kb --out runs/search_warm --steps 300
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from reinforce_pro.rollout.sampler import encode_prompt
from reinforce_pro.search import knowledge
from reinforce_pro.search.protocol import format_information

EXTRA_KB_SEED = 1_000_003  # the extra bases' seeds start here: far from any base a user builds by hand
NAME = re.compile(r"[A-Z][a-z]+")  # invented names are capitalised; nothing else in a base is


def search_plan(row: dict, passages: dict[str, str]) -> list[str]:
    """The queries a competent searcher issues for a knowledge-base question (knowledge.build's rows)."""
    subject = row["question"].rstrip("?")  # "home of Zorvik" or "home of mentor of Zorvik"
    if row["hops"] == 1:
        return [subject]
    attr, _, person = subject.split(" of ")
    mentor = passages[row["gold"][0]].rsplit(" is ", 1)[1].rstrip(".")  # "Zorvik's mentor is Talmeno."
    return [f"mentor of {person}", f"{attr} of {mentor}"]


def demonstration(row: dict, index, tokenizer, topk: int, info_chars: int, prompt_max_len: int = 64):
    """(token ids, trained mask) of one demonstrated episode; `index` answers the queries (BM25Index)."""
    ids = encode_prompt(tokenizer, row["question"], prompt_max_len)
    trained = [False] * len(ids)

    def add(text: str, model: bool) -> None:
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if model else [])
        ids.extend(tokens)
        trained.extend([model] * len(tokens))

    passages = {p["id"]: p["contents"] for p in index.passages}
    for query in search_plan(row, passages):
        add(f"<search>{query}</search>", model=True)
        (hits,) = index.search([query], topk)
        add(format_information([doc for doc, _ in hits], info_chars), model=False)
    add(f"<answer>{row['answer']}</answer>", model=True)
    return ids, trained


def warm_start(
    kb_dir: Path, out: Path, steps: int, share: float, topk: int, info_chars: int, seed: int, extra_kbs: int = 0
) -> dict:
    """The built-in tiny model (512 positions) warm-started on demonstrations of the first `share` of the train
    questions in `kb_dir` (knowledge.write's folder), plus every question of `extra_kbs` other generated
    knowledge bases (other names, other facts); saved to `out`.

    The extra bases teach what one base cannot: to copy a name it has never seen from the question into the
    query and from the retrieved passage into the answer. With one base of 200 people the model memorises its
    names and miscopies new ones. A question of an extra base that names anyone of `kb_dir` is left out, so
    nothing of the base being evaluated leaks in."""
    from transformers import AutoTokenizer

    from reinforce_pro.models.tiny import build_tiny_model
    from reinforce_pro.search.retriever import BM25Index
    from reinforce_pro.trainer.sft_warmup import sft_on_sequences

    rows = [json.loads(line) for line in (kb_dir / "train.jsonl").read_text().splitlines()]
    index = BM25Index.from_jsonl(kb_dir / "corpus.jsonl")
    base = build_tiny_model(out.parent / f"{out.name}_base", max_positions=512, seed=seed)
    tok = AutoTokenizer.from_pretrained(base)
    demos = [demonstration(r, index, tok, topk, info_chars) for r in rows[: int(len(rows) * share)]]
    demos += [demonstration(r, i, tok, topk, info_chars) for r, i in extra_questions(index.passages, extra_kbs, seed)]
    stats = sft_on_sequences(base, out, demos, steps=steps, seed=seed)
    return {**stats, "sft/demonstrations": len(demos)}


def extra_questions(corpus: list[dict], count: int, seed: int) -> list[tuple[dict, object]]:
    """(question, its base's BM25Index) for every question of `count` other generated knowledge bases of the
    same size as `corpus`'s, leaving out any that names a name of `corpus` (people, places, tools)."""
    from reinforce_pro.search.retriever import BM25Index

    taken = set(NAME.findall(" ".join(p["contents"] for p in corpus)))
    people = len({p["contents"].split("\n", 1)[0] for p in corpus})
    out = []
    for i in range(count):
        kb = knowledge.build(people, seed=EXTRA_KB_SEED + 1000 * seed + i)
        index = BM25Index(kb.passages)
        for row in kb.train + kb.heldout:
            if taken.isdisjoint(NAME.findall(f"{row['question']} {row['answer']}")):
                out.append((row, index))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kb", type=Path, required=True, help="folder of corpus.jsonl and train.jsonl")
    p.add_argument("--out", type=Path, required=True, help="folder of the warm-started model")
    p.add_argument("--steps", type=int, default=300, help="SFT steps")
    p.add_argument("--share", type=float, default=0.5, help="share of the train questions demonstrated")
    p.add_argument("--topk", type=int, default=2, help="passages per search, as the agent's SEARCH_TOPK")
    p.add_argument("--info_chars", type=int, default=110, help="as the agent's SEARCH_INFO_CHARS")
    p.add_argument("--extra_kbs", type=int, default=0, help="other generated bases whose questions teach copying names")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    stats = warm_start(a.kb, a.out, a.steps, a.share, a.topk, a.info_chars, a.seed, a.extra_kbs)
    print(f"[warm start] {a.steps} SFT steps on {stats['sft/demonstrations']} demonstrations: loss "
          f"{stats['sft/loss_first']:.3f} -> {stats['sft/loss_last']:.3f}; model in {a.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
