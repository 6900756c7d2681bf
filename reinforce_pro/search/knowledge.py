"""A knowledge base no pretrained model can know, for search-augmented RL (docs/agents.md).

Invented entities (names drawn from syllables with a seed) each have three facts: a home, a tool and a mentor
(another entity of the same split). One passage per fact, plus distractor passages that mention an entity
without stating a fact about it, make the corpus. Questions are single hop ("home of Zorvik?") or two hop
("home of mentor of Zorvik?": the mentor's name is in one passage, its home in another); each carries the ids of
its gold passages. Entities are split into train and held-out: a held-out question's facts (and the mentor it
goes through) belong to held-out entities only, so no fact of a held-out question is ever trained on.

    python -m reinforce_pro.search.knowledge --out data/kb --entities 200 --seed 0
    # -> corpus.jsonl (Search-R1's {"id", "contents": "title\\ntext"}), train.jsonl, heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "gr", "kl", "tr", "st"]
VOWELS = ["a", "e", "i", "o", "u"]
CODAS = ["", "", "n", "r", "s", "k", "l", "x"]
ATTRIBUTES = ("home", "tool", "mentor")  # mentor: another entity of the same split (the two-hop bridge)
DISTRACTORS = ("{e} once walked past a market.", "{e} wrote a letter to a friend.", "{e} likes quiet mornings.")
FACT = re.compile(r"([A-Z][a-z]+)'s (home|tool|mentor) is ([A-Z][a-z]+)\.")  # a fact passage's sentence
SUBJECT = re.compile(r"(?:(?:home|tool|mentor) of )+([A-Z][a-z]+)\?")  # a question's named person

# person -> attribute -> (value, id of the passage that states it)
Facts = dict[str, dict[str, tuple[str, str]]]


@dataclass(frozen=True)
class KnowledgeBase:
    passages: list[dict]  # {"id": "p12", "contents": "Zorvik\nZorvik's home is Plent."} (Search-R1's corpus rows)
    train: list[dict]  # {"question", "answer", "gold": [passage ids], "hops", "label": json of answer + gold}
    heldout: list[dict]


def invented_names(rng: random.Random, count: int, syllables: tuple[int, int] = (2, 2)) -> list[str]:
    """`count` distinct capitalised names of 2 syllables (onset + vowel + optional coda)."""
    names: set[str] = set()
    while len(names) < count:
        n = rng.randint(*syllables)
        names.add("".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(n)).capitalize())
    return sorted(names)


def build(entities: int = 200, heldout_frac: float = 0.25, seed: int = 0) -> KnowledgeBase:
    """The corpus and the train / held-out questions, all from `seed`."""
    rng = random.Random(seed)
    names = invented_names(rng, entities * 3)  # people, places, tools: disjoint sets of names
    rng.shuffle(names)
    people, places, tools = names[:entities], names[entities : 2 * entities], names[2 * entities :]
    n_held = max(2, int(entities * heldout_frac))
    splits = {"heldout": people[:n_held], "train": people[n_held:]}
    facts: dict[str, dict[str, str]] = {}
    for members in splits.values():
        for i, person in enumerate(members):
            others = members[:i] + members[i + 1 :]
            facts[person] = {"home": rng.choice(places), "tool": rng.choice(tools), "mentor": rng.choice(others)}
    passages, pid = [], {}
    for person in people:
        for attr in ATTRIBUTES:
            pid[person, attr] = f"p{len(passages)}"
            passages.append(
                {"id": pid[person, attr], "contents": f"{person}\n{person}'s {attr} is {facts[person][attr]}."}
            )
        distractor = rng.choice(DISTRACTORS).format(e=person)
        passages.append({"id": f"p{len(passages)}", "contents": f"{person}\n{distractor}"})
    rng.shuffle(passages)
    questions = {}
    for split, members in splits.items():
        rows = []
        for person in members:
            for attr in ("home", "tool"):
                rows.append(_question(f"{attr} of {person}?", facts[person][attr], [pid[person, attr]], 1))
                mentor = facts[person]["mentor"]
                gold = [pid[person, "mentor"], pid[mentor, attr]]
                rows.append(_question(f"{attr} of mentor of {person}?", facts[mentor][attr], gold, 2))
        rng.shuffle(rows)
        questions[split] = rows
    return KnowledgeBase(passages, questions["train"], questions["heldout"])


def _question(question: str, answer: str, gold: list[str], hops: int) -> dict:
    label = json.dumps({"answer": answer, "gold": gold})
    return {"question": question, "answer": answer, "gold": gold, "hops": hops, "label": label}


def read_facts(passages: list[dict]) -> Facts:
    """Every fact the corpus states, from its passages' sentences ("Zorvik's home is Plent."); a passage that
    states none (a distractor, or anything else a user's corpus holds) adds nothing."""
    facts: Facts = {}
    for passage in passages:
        for person, attr, value in FACT.findall(passage["contents"]):
            facts.setdefault(person, {}).setdefault(attr, (value, passage["id"]))
    return facts


def people(questions: list[dict]) -> set[str]:
    """The people a split's questions name (the last name of "home of mentor of Zorvik?")."""
    return {m.group(1) for row in questions if (m := SUBJECT.fullmatch(str(row.get("question", ""))))}


def load(folder: Path) -> KnowledgeBase:
    """A base that `write` saved (corpus.jsonl, train.jsonl, heldout.jsonl); ValueError naming the file and line
    of a row that is not a JSON object with the fields `write` gives it."""
    parts = {}
    for key, fields in (("corpus", ("id", "contents")), ("train", ("question", "answer")),
                        ("heldout", ("question", "answer"))):  # fmt: skip
        path, rows = Path(folder) / f"{key}.jsonl", []
        if not path.is_file():
            raise ValueError(f"{path}: no such file (a knowledge base folder holds corpus, train and heldout .jsonl)")
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            try:
                row = json.loads(line) if line.strip() else None
            except (json.JSONDecodeError, RecursionError):
                row = ()
            if row is None:
                continue
            if not isinstance(row, dict) or not all(isinstance(row.get(f), str) for f in fields):
                raise ValueError(f"{path}:{n}: not a JSON object with string fields {', '.join(fields)}")
            rows.append(row)
        parts[key] = rows
    return KnowledgeBase(parts["corpus"], parts["train"], parts["heldout"])


def write(kb: KnowledgeBase, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"corpus": out / "corpus.jsonl", "train": out / "train.jsonl", "heldout": out / "heldout.jsonl"}
    for key, rows in (("corpus", kb.passages), ("train", kb.train), ("heldout", kb.heldout)):
        paths[key].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for corpus.jsonl, train.jsonl, heldout.jsonl")
    p.add_argument("--entities", type=int, default=200, help="invented people (3 facts + 1 distractor each)")
    p.add_argument("--heldout_frac", type=float, default=0.25, help="share of the people held out")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    kb = build(args.entities, args.heldout_frac, args.seed)
    paths = write(kb, args.out)
    print(f"[knowledge] {len(kb.passages)} passages, {len(kb.train)} train / {len(kb.heldout)} held-out questions "
          f"-> {', '.join(str(p) for p in paths.values())}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
