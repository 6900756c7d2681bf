"""Search-R1's search agent (`--agent_func_path examples/python/agent_search.py`; docs/agents.md).

Each turn the model either searches or answers, in Search-R1's tags:
    <search>home of Zorvik</search>   -> the environment answers <information>Doc 1(Title: ...) ...</information>
    <answer>Plent</answer>            -> the episode ends; reward 1.0 for an exact match (normalised), else 0.0
The first complete tag of a turn decides. A turn with neither, an empty query, or a search beyond
SEARCH_MAX_SEARCHES gets a short correction from the environment and the model acts again (up to
--agent_max_turns turns); an answer longer than MAX_ANSWER_CHARS scores 0. Retrieved text is environment
tokens (action_mask 0): never trained, never in the IS correction.

Settings (environment variables, read when the file is loaded): SEARCH_RETRIEVER_URL (default
http://127.0.0.1:8000, the service of reinforce_pro.search.retriever), SEARCH_TOPK (3), SEARCH_INFO_CHARS
(the budget of one <information> block, 240 characters: tokens, for the built-in character tokenizer),
SEARCH_MAX_SEARCHES (4), SEARCH_TIMEOUT (5 s), SEARCH_OFF (1: every search is answered with an empty block, the
baseline "the same model without search"). A retriever that is down or answers outside the contract stops
the run with one line (reinforce_pro.search.retriever.RetrieverError).

The label (--label_key) is the answer, or JSON {"answer": ..., "gold": [passage ids]} as
reinforce_pro.search.knowledge writes it; with gold ids the hit rate is logged. Per episode (summed over turns,
logged as reward/<name>): searches, searched (0/1), hit (0/1: a gold passage was in some search's top-k),
correct (0/1), invalid (turns with neither tag).
"""

import asyncio
import os

from reinforce_pro.search.protocol import format_information, normalize, parse_action, parse_label
from reinforce_pro.search.retriever import RetrieverClient

URL = os.environ.get("SEARCH_RETRIEVER_URL", "http://127.0.0.1:8000")
TOPK = int(os.environ.get("SEARCH_TOPK", "3"))
INFO_CHARS = int(os.environ.get("SEARCH_INFO_CHARS", "240"))
MAX_SEARCHES = int(os.environ.get("SEARCH_MAX_SEARCHES", "4"))
TIMEOUT = float(os.environ.get("SEARCH_TIMEOUT", "5"))
OFF = os.environ.get("SEARCH_OFF", "0") == "1"
MAX_ANSWER_CHARS = 64
INVALID = "\n<information>invalid: write <search>query</search> or <answer>text</answer></information>\n"
CLIENT = RetrieverClient(URL, timeout=TIMEOUT)


class AgentInstance:
    def __init__(self):
        self.searches = 0
        self.hit = False

    async def reset(self, states: dict) -> dict:
        return {"observation": states["prompt"]}

    async def step(self, states: dict) -> dict:
        answer, gold = parse_label(states["label"])
        kind, content = parse_action(states["action_text"])
        logs = {"searches": 0.0, "searched": 0.0, "hit": 0.0, "correct": 0.0, "invalid": 0.0}
        if kind == "answer":
            correct = len(content) <= MAX_ANSWER_CHARS and normalize(content) == normalize(answer)
            logs["correct"] = float(correct)
            return {"rewards": float(correct), "scores": float(correct), "environment_feedback": "", "done": True,
                    "extra_logs": logs}  # fmt: skip
        if kind == "search" and self.searches < MAX_SEARCHES:
            (documents,) = [[]] if OFF else await asyncio.to_thread(CLIENT.retrieve, [content], TOPK)
            logs.update(searches=1.0, searched=float(self.searches == 0))
            self.searches += 1
            if gold and not self.hit and gold & {str(d.get("id")) for d in documents}:
                self.hit, logs["hit"] = True, 1.0
            feedback = format_information(documents, INFO_CHARS)
        else:
            logs["invalid"] = 1.0
            feedback = INVALID if kind != "search" else "\n<information>no more searches: answer now</information>\n"
        return {"rewards": 0.0, "scores": 0.0, "environment_feedback": feedback, "done": False, "extra_logs": logs}
