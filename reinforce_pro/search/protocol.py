"""Search-R1's turn format, shared by the search agent (examples/python/agent_search.py) and the warm-start
demonstrations: what a model turn may say, how retrieved passages are shown, how answers are compared.

    <search>query</search>   the model asks; the environment answers <information>Doc 1(Title: t) ...</information>
    <answer>text</answer>    the model answers; exact match after normalisation
"""

from __future__ import annotations

import json
import re
import string

TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


def parse_action(text: str) -> tuple[str, str]:
    """("search", query) | ("answer", text) | ("invalid", why): the first complete tag decides."""
    match = TAG.search(text)
    if match is None:
        return "invalid", "no <search> or <answer> tag"
    kind, content = match.group(1), match.group(2).strip()
    if kind == "search" and not content:
        return "invalid", "empty query"
    return kind, content


def normalize(text: str) -> str:
    """Search-R1's exact-match normalisation: lowercase, no punctuation, no articles, single spaces."""
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def format_information(documents: list[dict], budget: int) -> str:
    """Search-R1's reference block ("Doc i(Title: t) text"), cut to `budget` characters of content."""
    lines = []
    for i, doc in enumerate(documents, 1):
        title, _, text = doc["contents"].partition("\n")
        lines.append(f"Doc {i}(Title: {title}) {text}")
    body = "\n".join(lines)
    return f"\n<information>{body[:budget]}</information>\n"


def parse_label(label) -> tuple[str, set[str]]:
    """(answer, gold passage ids) from a plain answer or {"answer", "gold"} JSON."""
    if isinstance(label, str) and label.lstrip().startswith("{"):
        try:
            data = json.loads(label)
            return str(data["answer"]), {str(g) for g in data.get("gold", [])}
        except (json.JSONDecodeError, KeyError, TypeError):
            pass
    return str(label), set()
