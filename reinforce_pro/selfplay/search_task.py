"""Search self-play (`--selfplay_task search`): the proposer writes questions about a corpus, the solver answers
them by searching it, and no question is written by a person.

The corpus is a knowledge base of reinforce_pro.search.knowledge (`--selfplay_kb`, or the default base built
in memory): invented people with a home, a tool and a mentor, one passage per fact. A proposer prompt shows a
seed, a fact passage of a train person ("[Zorvik's mentor is Talmeno.]>"), or with
--selfplay_reference_buffer a question that was learnable; the proposer writes a question in the base's grammar

    home of Zorvik?                    one hop
    tool of mentor of Zorvik?          two hops (the mentor's name is in one passage, its tool in another)
    home of mentor of mentor of Zorvik?   ... up to MAX_HOPS

The task validates it (the grammar, a train person the corpus knows, every fact of the chain stated, the answer
not in the question) and computes its gold answer and passages by following the facts. A question naming a
held-out person is invalid, so the held-out questions stay unseen. The solver answers with the search agent's
multi-turn episodes (search/agent.py) against the retrieval service (`--selfplay_retriever_url`, or one this
task serves on 127.0.0.1 from the corpus); retrieved text is environment tokens, out of the loss and of the IS
correction. The held-out ladder is the base's held-out questions by hop count.
"""

from __future__ import annotations

import json
import random
import re
import threading
from pathlib import Path

from reinforce_pro.search import knowledge
from reinforce_pro.search.agent import final_answer, is_correct, search_agent
from reinforce_pro.search.protocol import normalize
from reinforce_pro.selfplay.tasks import (
    SOME_BUT_NOT_ALL,
    Judge,
    ParsedQuestion,
    Question,
    ScoredResponses,
    SelfPlayTask,
)

MAX_HOPS = 4
MAX_QUESTION_CHARS = 80
QUESTION = re.compile(r"(home|tool|mentor)((?: of mentor)*) of ([A-Z][a-z]+)\?")


class SearchTask(SelfPlayTask):
    name = "search"
    thresholds = {"completion": SOME_BUT_NOT_ALL}
    weights = {"completion": 1.0}
    sampling = {"proposer": {"max_tokens": 48}}  # a question; the solver's turns keep the run's budget
    tiny_model_positions = 512  # the embedded model holds a whole episode: question, turns, retrieved blocks
    # the search agent's settings, as studies/search_agent.py measured it
    topk, info_chars, max_searches, solver_turns = 2, 110, 3, 4
    sampling_max_tokens = 40  # a solver turn of the warm start's probe: a <search> or an <answer>

    def __init__(self, kb_dir: str | Path | None = None, retriever_url: str | None = None) -> None:
        self.kb = knowledge.load(Path(kb_dir)) if kb_dir else knowledge.build(200, seed=0)
        self.facts = knowledge.read_facts(self.kb.passages)
        self.train_people = knowledge.people(self.kb.train)
        self.heldout_people = knowledge.people(self.kb.heldout)
        if not self.train_people:
            raise ValueError(f"--selfplay_kb {kb_dir}: no train question names a person the grammar knows")
        self._url, self._server, self._lock = retriever_url, None, threading.Lock()

    # ------------------------------------------------------------------ the proposer
    def seed_records(self, n: int, seed: int) -> list[dict]:
        """`n` fact passages of train people, drawn with replacement."""
        rng = random.Random(seed)
        facts = [f"{p}'s {a} is {v}." for p in sorted(self.train_people) for a, (v, _) in self.facts.get(p, {}).items()]
        return [{"seed": rng.choice(facts)} for _ in range(n)]

    def proposer_prompt(self, record: dict) -> str:
        seed = record.get("seed") if isinstance(record, dict) else None
        if not isinstance(seed, str):
            raise ValueError(f'a search self-play seed record is {{"seed": "<passage or question>"}}, got {record!r}')
        return f"[{seed[:MAX_QUESTION_CHARS]}]>"

    def reference_record(self, question: Question) -> dict:
        return {"seed": question.text}

    def parse_question(self, text: str) -> ParsedQuestion:
        text = text.strip()
        if not text:
            return ParsedQuestion(None, "empty")
        if len(text) > MAX_QUESTION_CHARS:
            return ParsedQuestion(None, f"longer than {MAX_QUESTION_CHARS} characters")
        match = QUESTION.fullmatch(text)
        if match is None:
            return ParsedQuestion(None, "not '<home|tool|mentor> of [mentor of ...] Name?'")
        attr, chain, person = match.groups()
        hops = 1 + chain.count("mentor")
        if hops > MAX_HOPS:
            return ParsedQuestion(None, f"{hops} hops; at most {MAX_HOPS}")
        if person in self.heldout_people:
            return ParsedQuestion(None, f"names {person}, a held-out person")
        if person not in self.train_people:
            return ParsedQuestion(None, f"names {person}, no train person of the corpus")
        gold, current = [], person
        for step in ["mentor"] * (hops - 1) + [attr]:
            fact = self.facts.get(current, {}).get(step)
            if fact is None:
                return ParsedQuestion(None, f"the corpus states no {step} of {current}")
            current, passage = fact
            gold.append(passage)
        if normalize(current) in normalize(text).split():
            return ParsedQuestion(None, f"the answer {current} is in the question")
        label = json.dumps({"answer": current, "gold": gold})
        return ParsedQuestion(Question(text, current, {"hops": hops, "subject": person, "gold": gold, "label": label}))

    def difficulty(self, question: Question) -> dict[str, float]:
        return {"hops": float(question.meta["hops"])}

    # ------------------------------------------------------------------ the solver
    def solver_prompt(self, question: Question) -> str:
        return question.text

    def solver_agent(self) -> type:
        """The search agent class of the solver's episodes; the first call starts the retrieval service when
        no --selfplay_retriever_url names one."""
        from reinforce_pro.search.retriever import RetrieverClient

        return search_agent(RetrieverClient(self.retriever_url()), self.topk, self.info_chars, self.max_searches)

    def retriever_url(self) -> str:
        """--selfplay_retriever_url, or the task's own service on 127.0.0.1: started at the first call, and at every
        later one checked and started again on its port if it stopped answering (serving.KeptServer)."""
        with self._lock:
            if self._url is not None:
                return self._url
            if self._server is None:
                from reinforce_pro.search.retriever import BM25Index, kept_server

                self._server = kept_server(BM25Index(self.kb.passages), max_concurrency=16)
                self._server.start()
            else:
                self._server.ensure()
            return self._server.url

    def close(self) -> None:
        """Stop the retrieval service this task started (if any)."""
        with self._lock:
            if self._server is not None:
                self._server.stop()
                self._server = None

    def score(self, question: Question, responses: list[str], judge: Judge | None = None) -> ScoredResponses:
        """`responses`: each episode's last model turn. Right when its <answer> matches the gold answer after
        Search-R1's normalisation; the format reward is 1 when the episode ended with an <answer>."""
        answers = [final_answer(r) for r in responses]
        right = [a is not None and is_correct(a, question.answer) for a in answers]
        return ScoredResponses({"completion": [float(r) for r in right]}, [float(a is not None) for a in answers])

    def ladder(self) -> dict[str, list[Question]]:
        """The base's held-out questions, by hop count: people no proposal may name."""
        levels: dict[str, list[Question]] = {}
        for row in self.kb.heldout:
            hops = int(row.get("hops", row["question"].count(" of ")))
            meta = {"hops": hops, "label": row.get("label", row["answer"])}
            levels.setdefault(f"hops{hops}", []).append(Question(row["question"], row["answer"], meta))
        return dict(sorted(levels.items()))

    # ------------------------------------------------------------------ the warm start
    def warm_start_stop(self, target: float, seed: int, questions: int = 48, max_len: int = 512):
        """The warm start's stop condition: greedy search episodes on `questions` questions of one more generated
        base (not this one, none of the demonstrated ones), true once their accuracy reaches `target`. A warm
        start stopped there leaves the same room to learn at every seed (a fixed step count does not)."""
        from reinforce_pro.agents.runner import AgentConfig, AgentRunner
        from reinforce_pro.search.demonstrations import extra_questions
        from reinforce_pro.trainer.sft_warmup import AccuracyStop, greedy_sampler

        probe = extra_questions(self.kb.passages, 1, seed)
        rows = [{"prompt": r["question"], "label": r["label"]} for r, _ in random.Random(seed).sample(probe, questions)]
        agent = search_agent(probe[0][1], self.topk, self.info_chars, self.max_searches)  # the probe base's index
        cfg = AgentConfig(max_turns=self.solver_turns, max_len=max_len, prompt_max_len=64)

        def accuracy(model, tok) -> float:
            model.eval()
            sampling = {"temperature": 0.0, "max_tokens": self.sampling_max_tokens}
            episodes = AgentRunner(agent, tok, greedy_sampler(model, tok), sampling, cfg).run_episodes(rows, n=1)
            model.train()
            return sum(sum(e.extra_logs.get("correct", [0.0])) for e in episodes) / len(episodes)

        return AccuracyStop(accuracy, target, every=10)  # the accuracy jumps ~0 -> 0.5 within 50 steps

    def warm_start_sequences(self, tokenizer, n: int, seed: int) -> list[tuple[list[int], list[bool]]]:
        """Demonstrations of both roles' formats on `n` other generated bases (other names, other facts; none
        names a name of this base), never on this base's questions: proposals written from seed passages, and
        search episodes laid out as the agent runner lays them out."""
        from reinforce_pro.rollout.sampler import encode_prompt
        from reinforce_pro.search.demonstrations import demonstration, extra_questions

        out = []
        for row, index in extra_questions(self.kb.passages, n, seed):
            out.append(demonstration(row, index, tokenizer, self.topk, self.info_chars))
            # the proposal of the same question from its first gold passage: "Zorvik's home is Plent." -> "home of
            # Zorvik?", "Zorvik's mentor is Talmeno." -> "tool of mentor of Zorvik?"
            passage = next(p["contents"] for p in index.passages if p["id"] == row["gold"][0]).split("\n", 1)[1]
            prompt = encode_prompt(tokenizer, self.proposer_prompt({"seed": passage}), 64)
            question = tokenizer(row["question"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            out.append((prompt + question, [False] * len(prompt) + [True] * len(question)))
        return out
