"""Search-R1's search agent as a class factory: the environment of one search episode.

Each turn the model either searches or answers, in Search-R1's tags (search/protocol.py):
    <search>home of Zorvik</search>   -> the environment answers <information>Doc 1(Title: ...) ...</information>
    <answer>Plent</answer>            -> the episode ends; reward 1.0 for an exact match (normalised), else 0.0
The first complete tag of a turn decides. A turn with neither, an empty query, or a search beyond
`max_searches` gets a short correction from the environment and the model acts again (up to the runner's turn
limit); an answer longer than MAX_ANSWER_CHARS scores 0.

Used by the agent file examples/python/agent_search.py (settings from environment variables) and by the search
self-play task (selfplay/search_task.py, settings from its flags).
"""

from __future__ import annotations

import asyncio
import os

from reinforce_pro.search.protocol import format_information, normalize, parse_action, parse_label

MAX_ANSWER_CHARS = 64
INVALID = "\n<information>invalid: write <search>query</search> or <answer>text</answer></information>\n"
NO_MORE = "\n<information>no more searches: answer now</information>\n"


def search_agent(client, topk: int, info_chars: int, max_searches: int, off: bool = False) -> type:
    """An AgentInstance class (agents/contract.py) whose searches `client` (a RetrieverClient) answers with
    `topk` passages cut to `info_chars` characters; `off`: every search is answered with an empty block (the
    baseline "the same model without search").

    The label is the answer, or JSON {"answer", "gold": [passage ids]}; with gold ids the hit rate is logged.
    Per episode (summed over turns, logged as reward/<name>): searches, searched (0/1), hit (0/1: a gold passage
    was in some search's top-k), correct (0/1), invalid (turns with neither tag)."""

    class AgentInstance:
        def __init__(self) -> None:
            self.searches = 0
            self.hit = False

        async def reset(self, states: dict) -> dict:
            return {"observation": states["prompt"]}

        async def step(self, states: dict) -> dict:
            answer, gold = parse_label(states["label"])
            kind, content = parse_action(states["action_text"])
            logs = {"searches": 0.0, "searched": 0.0, "hit": 0.0, "correct": 0.0, "invalid": 0.0}
            if kind == "answer":
                correct = is_correct(content, answer)
                logs["correct"] = float(correct)
                return {"rewards": float(correct), "scores": float(correct), "environment_feedback": "", "done": True,
                        "extra_logs": logs}  # fmt: skip
            if kind == "search" and self.searches < max_searches:
                (documents,) = [[]] if off else await asyncio.to_thread(client.retrieve, [content], topk)
                logs.update(searches=1.0, searched=float(self.searches == 0))
                self.searches += 1
                if gold and not self.hit and gold & {str(d.get("id")) for d in documents}:
                    self.hit, logs["hit"] = True, 1.0
                feedback = format_information(documents, info_chars)
            else:
                logs["invalid"] = 1.0
                feedback = INVALID if kind != "search" else NO_MORE
            return {"rewards": 0.0, "scores": 0.0, "environment_feedback": feedback, "done": False, "extra_logs": logs}

    return AgentInstance


def search_agent_from_environment() -> type:
    """search_agent with the agent files' settings from environment variables (examples/python/agent_search.py
    lists them): SEARCH_RETRIEVER_URL, SEARCH_TIMEOUT, SEARCH_TOPK, SEARCH_INFO_CHARS, SEARCH_MAX_SEARCHES,
    SEARCH_OFF."""
    from reinforce_pro.search.retriever import RetrieverClient

    env = os.environ.get
    client = RetrieverClient(env("SEARCH_RETRIEVER_URL", "http://127.0.0.1:8000"),
                             timeout=float(env("SEARCH_TIMEOUT", "5")))  # fmt: skip
    return search_agent(
        client, topk=int(env("SEARCH_TOPK", "3")), info_chars=int(env("SEARCH_INFO_CHARS", "240")),
        max_searches=int(env("SEARCH_MAX_SEARCHES", "4")), off=env("SEARCH_OFF", "0") == "1",
    )  # fmt: skip


def is_correct(given: str, answer: str) -> bool:
    """Search-R1's exact match after normalisation, for an answer of at most MAX_ANSWER_CHARS characters."""
    return len(given) <= MAX_ANSWER_CHARS and normalize(given) == normalize(answer)


def final_answer(model_text: str) -> str | None:
    """The answer of a model turn (its first complete tag is <answer>), or None."""
    kind, content = parse_action(model_text)
    return content if kind == "answer" else None
