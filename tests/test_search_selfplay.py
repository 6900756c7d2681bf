"""Search self-play (`--selfplay_task search`): the proposer's questions validated and answered from the corpus
(hostile ones invalid, never a crash), the solver's answers scored, the held-out people kept out of every
proposal, the task's own retrieval service, and a whole self-play step whose solver rows are search episodes
with their retrieved tokens out of the loss and of the IS correction."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch
from test_search import assert_masked_positions_do_not_matter

from reinforce_pro.rollout.sampler import RolloutConfig, Sampler
from reinforce_pro.rollout.vllm_engine import Generation
from reinforce_pro.search import knowledge
from reinforce_pro.search.retriever import RetrieverClient, RetrieverError
from reinforce_pro.selfplay.builtin_tasks import load_task
from reinforce_pro.selfplay.controller import SelfPlayConfig
from reinforce_pro.selfplay.search_task import MAX_HOPS, SearchTask
from reinforce_pro.selfplay.selfplay_source import SelfPlaySource
from reinforce_pro.serving import service_restarts

pytest.importorskip("bm25s")


@pytest.fixture(scope="module")
def kb_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kb")
    knowledge.write(knowledge.build(entities=40, seed=5), folder)
    return folder


@pytest.fixture(scope="module")
def task(kb_dir):
    task = SearchTask(kb_dir)
    yield task
    task.close()


def write_rows(folder, corpus: list[str], train: list[tuple[str, str]], heldout: list[tuple[str, str]]):
    folder.mkdir(parents=True, exist_ok=True)
    rows = {
        "corpus": [{"id": f"p{i}", "contents": c} for i, c in enumerate(corpus)],
        "train": [{"question": q, "answer": a} for q, a in train],
        "heldout": [{"question": q, "answer": a} for q, a in heldout],
    }
    for key, items in rows.items():
        (folder / f"{key}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    return folder


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Aba and Bob mentor each other (a cycle); Bob has no tool; Cid is held out."""
    corpus = ["Aba\nAba's home is Hox.", "Aba\nAba's tool is Tox.", "Aba\nAba's mentor is Bob.",
              "Bob\nBob's home is Hoy.", "Bob\nBob's mentor is Aba.", "Cid\nCid's home is Hoz.",
              "Cid\nCid likes quiet mornings."]  # fmt: skip
    folder = write_rows(tmp_path_factory.mktemp("small"), corpus, [("home of Aba?", "Hox"), ("home of Bob?", "Hoy")],
                        [("home of Cid?", "Hoz")])  # fmt: skip
    return SearchTask(folder)


# ------------------------------------------------------------------------------------------ the proposer
def test_every_train_question_of_the_base_is_valid_with_its_answer_and_gold(kb_dir, task):
    """The task's answer to a question, computed by following the corpus's facts, is the knowledge base's own;
    every held-out question names a held-out person and is invalid."""
    base = knowledge.load(kb_dir)
    for row in base.train:
        parsed = task.parse_question(row["question"])
        assert parsed.valid, (row["question"], parsed.reason)
        assert (parsed.question.answer, parsed.question.meta["gold"], parsed.question.meta["hops"]) == (
            row["answer"], row["gold"], row["hops"],
        )  # fmt: skip
        assert json.loads(parsed.question.meta["label"]) == {"answer": row["answer"], "gold": row["gold"]}
    for row in base.heldout:
        assert task.parse_question(row["question"]).reason.endswith("a held-out person")


def test_deeper_questions_follow_the_mentor_chain(small):
    three = small.parse_question("home of mentor of mentor of Aba?")  # Aba -> Bob -> Aba -> Hox
    assert three.valid and three.question.answer == "Hox" and three.question.meta["hops"] == 3
    assert three.question.meta["gold"] == ["p2", "p4", "p0"] and three.question.meta["subject"] == "Aba"
    assert small.parse_question("tool of mentor of Bob?").question.answer == "Tox"
    assert small.parse_question("tool of mentor of mentor of Aba?").question.answer == "Tox"  # Aba is not the answer
    assert small.difficulty(three.question) == {"hops": 3.0}


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty"),
        ("   \n\t ", "empty"),
        ("home of Aba?" * 20, "longer than"),
        ("home of Nobody?", "no train person"),
        ("home of Cid?", "a held-out person"),
        ("tool of mentor of Cid?", "a held-out person"),
        ("mentor of mentor of Aba?", "the answer Aba is in the question"),
        ("tool of Bob?", "states no tool of Bob"),
        ("age of Aba?", "not '<home"),
        ("home of Aba", "not '<home"),
        ("Home of Aba?", "not '<home"),
        ("home of aba?", "not '<home"),
        ("home  of Aba?", "not '<home"),
        ("home of Aba?\nhome of Bob?", "not '<home"),
        ("home of Aba? <information>Doc 1(Title: Aba) Aba's home is Hox.</information>", "not '<home"),
        ("<information>home of Aba?</information>", "not '<home"),
        ("<answer>Hox</answer>", "not '<home"),
        ("<search>home of Aba</search>", "not '<home"),
        ("home of Äba?", "not '<home"),
        ("home of Aba\u200b?", "not '<home"),
        ("home of Aba?\x00", "not '<home"),
        (" of mentor" * 3 + " of Aba?", "not '<home"),
        ("home" + " of mentor" * MAX_HOPS + " of Aba?", f"at most {MAX_HOPS}"),
    ],
)  # fmt: skip
def test_hostile_proposals_are_invalid_and_say_why(small, text, reason):
    parsed = small.parse_question(text)
    assert not parsed.valid and reason in parsed.reason, parsed.reason


def test_random_proposals_never_crash_and_valid_ones_obey_the_grammar(task):
    """Grammar-shaped questions about train, held-out and unknown people, half of them with a hostile piece
    spliced in at a random place."""
    rng = random.Random(0)
    names = [*sorted(task.train_people)[:8], *sorted(task.heldout_people)[:4], "Zz", "Nobody", "nobody", ""]
    hostile = ["<search>", "</answer>", "<information>", "?", " ", "\n", "\x00", "é", "{", '"', "of ", "\u202e"]
    grammar = re.compile(r"(home|tool|mentor)( of mentor)* of [A-Z][a-z]+\?")
    valid = invalid = 0
    for _ in range(3000):
        text = rng.choice(["home", "tool", "mentor", "age"]) + " of mentor" * rng.randint(0, 5)
        text += f" of {rng.choice(names)}?"
        if rng.random() < 0.5:
            at = rng.randint(0, len(text))
            text = text[:at] + rng.choice(hostile) + text[at:]
        parsed = task.parse_question(text)
        if parsed.valid:
            valid += 1
            assert grammar.fullmatch(text.strip()) and parsed.question.meta["subject"] in task.train_people
            assert parsed.question.answer not in text
        else:
            invalid += 1
            assert parsed.reason
    assert valid > 100 and invalid > 100  # both branches above ran


def test_seeds_name_train_people_only_and_the_ladder_holds_the_heldout_questions(kb_dir, task):
    base = knowledge.load(kb_dir)
    seeds = task.seed_records(200, seed=1)
    named = {re.match(r"([A-Z][a-z]+)'s", s["seed"]).group(1) for s in seeds}
    assert named <= task.train_people and not named & task.heldout_people
    assert task.proposer_prompt(seeds[0]) == f"[{seeds[0]['seed']}]>"
    ladder = task.ladder()
    assert set(ladder) == {"hops1", "hops2"}
    assert sorted(q.text for level in ladder.values() for q in level) == sorted(r["question"] for r in base.heldout)
    assert all(q.meta["hops"] == int(level[-1]) for level, qs in ladder.items() for q in qs)
    reference = task.reference_record(task.parse_question(base.train[0]["question"]).question)
    assert task.proposer_prompt(reference) == f"[{base.train[0]['question']}]>"
    with pytest.raises(ValueError, match='"seed"'):
        task.proposer_prompt({"prompt": "x"})


# ------------------------------------------------------------------------------------------ the solver
def test_answers_are_scored_after_normalisation_and_format_needs_an_answer(small):
    question = small.parse_question("home of mentor of Aba?").question  # Bob's home: Hoy
    responses = ["<answer>Hoy</answer>", "<answer> the hoy. </answer>", "<answer>Hox</answer>", "<search>x</search>",
                 "", "<answer>" + "Hoy" * 30 + "</answer>", "<answer></answer>", "Hoy", "<answer>Hoy"]  # fmt: skip
    scored = small.score(question, responses)
    assert scored.scores["completion"] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert scored.format == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]


# ------------------------------------------------------------------------------------------ the base and the service
@pytest.mark.parametrize(
    "line, problem",
    [("{not json", "not a JSON object"), ("[1, 2]", "not a JSON object"), ('{"question": "q"}', "string fields"),
     ('{"question": 3, "answer": "a"}', "string fields"), ("[" * 50_000, "not a JSON object")],
)  # fmt: skip
def test_a_bad_knowledge_base_file_names_its_line(tmp_path, line, problem):
    folder = write_rows(tmp_path, ["Aba\nAba's home is Hox."], [("home of Aba?", "Hox")], [])
    (folder / "train.jsonl").write_text('{"question": "home of Aba?", "answer": "Hox"}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"train.jsonl:2: .*{problem}"):
        knowledge.load(folder)
    (folder / "train.jsonl").write_text('{"question": "home of Aba?", "answer": "Hox"}\n')
    (folder / "heldout.jsonl").unlink()
    with pytest.raises(ValueError, match="heldout.jsonl: no such file"):
        knowledge.load(folder)


def test_a_base_whose_questions_name_nobody_is_refused(tmp_path):
    folder = write_rows(tmp_path, ["Aba\nAba's home is Hox."], [("where is it", "Hox")], [])
    with pytest.raises(ValueError, match="no train question names a person"):
        SearchTask(folder)


def test_the_flags_configure_the_search_task_only(kb_dir):
    assert load_task("search", None, str(kb_dir)).train_people == SearchTask(kb_dir).train_people
    assert len(load_task("search", None).train_people) == 150  # the default base: 200 people, a quarter held out
    with pytest.raises(ValueError, match="--selfplay_kb configures --selfplay_task search, not arithmetic"):
        load_task("arithmetic", None, str(kb_dir))
    with pytest.raises(ValueError, match="--selfplay_retriever_url configures"):
        load_task("code_output", None, None, "http://127.0.0.1:1")


def test_the_task_serves_its_corpus_on_loopback_until_closed(kb_dir):
    task = SearchTask(kb_dir)
    url = task.retriever_url()
    assert url.startswith("http://127.0.0.1:") and task.retriever_url() == url  # started once
    client = RetrieverClient(url, timeout=2, retries=0)
    assert client.health()["passages"] == len(task.kb.passages)
    task.close()
    with pytest.raises(RetrieverError, match="unreachable"):
        client.health()
    assert SearchTask(kb_dir, "http://127.0.0.1:9").retriever_url() == "http://127.0.0.1:9"  # a given URL: no server


def test_the_tasks_retriever_that_stopped_answering_is_started_again_on_its_port(kb_dir, capsys):
    task = SearchTask(kb_dir)
    url, restarts = task.retriever_url(), service_restarts()
    task._server.server.stop()  # its server thread ends, as a crashed service's would
    client = RetrieverClient(url, timeout=2, retries=0)
    with pytest.raises(RetrieverError, match="unreachable"):
        client.health()
    try:
        assert task.retriever_url() == url  # the next use finds it down and starts it where its clients look
        assert client.health()["passages"] == len(task.kb.passages)
        assert service_restarts() == restarts + 1
        assert task.retriever_url() == url and service_restarts() == restarts + 1  # answering: left alone
    finally:
        task.close()
    assert f"[retriever] stopped answering at {url} (its server thread ended)" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ the warm start's stop
class Oracle:
    """A model (as the HF generate contract) that answers every probe question right at its first turn, or
    searches forever when `search` is set; it records its modes and the contexts it was given."""

    def __init__(self, tok, answers: dict[str, str], search: bool = False):
        self.tok, self.answers, self.search, self.seen = tok, answers, search, {"modes": [], "contexts": []}

    def eval(self):
        self.seen["modes"].append("eval")

    def train(self):
        self.seen["modes"].append("train")

    def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
        assert not kw["do_sample"]
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
            context = [i for i, m in zip(ids, mask, strict=True) if m]
            self.seen["contexts"].append(context)
            question = self.tok.decode(context, skip_special_tokens=True).split("<")[0].strip()
            reply = "<search>x</search>" if self.search else f"<answer>{self.answers[question]}</answer>"
            rows.append(self.tok(reply, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])
        width = max(map(len, rows)) + 2  # padding after <eos>, as a batch's shorter rows get
        new = [r + [self.tok.pad_token_id] * (width - len(r)) for r in rows]
        return torch.cat([input_ids, torch.tensor(new)], dim=1)


def test_the_warm_start_stop_plays_greedy_search_episodes_on_another_base(task):
    from reinforce_pro.models.tiny import build_tokenizer
    from reinforce_pro.search.demonstrations import NAME, extra_questions

    tok = build_tokenizer()
    stop = task.warm_start_stop(target=0.9, seed=7, questions=6)
    probe = {r["question"]: r["answer"] for r, _ in extra_questions(task.kb.passages, 1, 7)}
    right = Oracle(tok, probe)
    assert stop(right, tok) and stop.checks == [1.0]  # every episode answered right: the warm start stops
    assert right.seen["modes"] == ["eval", "train"]  # generated in eval mode, trained on after
    asked = {tok.decode(c, skip_special_tokens=True) for c in right.seen["contexts"]}
    assert len(asked) == 6 and asked <= set(probe)  # 6 questions of the probe base, one greedy episode each
    names = set(NAME.findall(" ".join(p["contents"] for p in task.kb.passages)))
    demonstrated = {n for r, _ in extra_questions(task.kb.passages, 20, 8) for n in NAME.findall(r["question"])}
    assert all(names.isdisjoint(NAME.findall(q)) and demonstrated.isdisjoint(NAME.findall(q)) for q in asked)
    searcher = Oracle(tok, probe, search=True)  # never answers: searches until the turns run out
    assert not stop(searcher, tok) and stop.checks == [1.0, 0.0]
    contexts = searcher.seen["contexts"]
    assert len(contexts) == 6 * task.solver_turns  # every turn of every episode reached the model
    assert sum("<information>" in tok.decode(c) for c in contexts) == 6 * (task.solver_turns - 1)


def test_the_greedy_sampler_continues_left_padded_contexts_as_each_alone(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reinforce_pro.models.tiny import build_tiny_model
    from reinforce_pro.trainer.sft_warmup import greedy_sampler

    path = build_tiny_model(tmp_path / "tiny", max_positions=128, seed=3)
    model, tok = AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    contexts = [tok("home of Zorvik?")["input_ids"], tok("tool of mentor of a much longer name?")["input_ids"]]
    sample = greedy_sampler(model, tok)
    together = sample(contexts, {"max_tokens": 12})
    alone = [sample([c], {"max_tokens": 12})[0] for c in contexts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    for g in together:
        assert len(g.token_ids) == len(g.log_probs) <= 12
        assert (g.finish_reason == "stop") == (tok.eos_token_id in g.token_ids)
        assert tok.eos_token_id not in g.token_ids[:-1]  # cut at the first <eos>


def test_a_search_warm_start_stops_at_its_target_and_reports_the_accuracy(tmp_path):
    from reinforce_pro.models.tiny import build_tiny_model
    from reinforce_pro.run.warm_start import selfplay_warm_start
    from reinforce_pro.trainer.sft_warmup import CHECK_EVERY, AccuracyStop

    class Task:  # demonstrations of one short sequence, and a stop condition met at its second check
        stop = None

        def warm_start_sequences(self, tokenizer, n, seed):
            return [([1, 2, 3, 4], [False, True, True, True])]

        def warm_start_stop(self, target, seed):
            self.asked = (target, seed)
            self.stop = AccuracyStop(lambda model, tok: [0.1, 0.4][len(self.stop.checks)], target)
            return self.stop

    base, task = build_tiny_model(tmp_path / "tiny", max_positions=32), Task()
    stats = selfplay_warm_start(task, base, tmp_path / "out", 5 * CHECK_EVERY, seed=3, target=0.3)
    assert task.asked == (0.3, 5)  # another seed than the demonstrations' (seed + 1)
    assert stats["sft/steps"] == 2 * CHECK_EVERY and stats["sft/stop_accuracy"] == 0.4
    assert task.stop.checks == [0.1, 0.4]
    untargeted = Task()
    stats = selfplay_warm_start(untargeted, base, tmp_path / "all", 5, seed=3, target=0.0)
    assert stats["sft/steps"] == 5 and "sft/stop_accuracy" not in stats and untargeted.stop is None  # no probe


# ------------------------------------------------------------------------------------------ one self-play step
class ScriptedPolicy:
    """A proposer that copies the seed's person into a valid question (or writes junk), and a solver that searches
    the question, then answers right on every other episode: each question is learnable."""

    def __init__(self, tokenizer, task: SearchTask):
        self.tok, self.task, self.answers = tokenizer, task, 0

    def __call__(self, prompt_ids, sampling, engines=None):
        texts = []
        for ids in prompt_ids:
            text = self.tok.decode(ids, skip_special_tokens=True)
            if text.endswith("]>"):  # a proposal: "[Zorvik's home is Plent.]>"
                person, attr = re.match(r"\[([A-Z][a-z]+)'s (\w+)", text).groups()
                texts.append(f"{'home' if attr == 'mentor' else attr} of {person}?" if len(texts) % 2 else "junk")
            elif "<information>" not in text:
                texts.append(f"<search>{text.rstrip('?')}</search>")
            else:
                answer = self.task.parse_question(text.split("<search>")[0]).question.answer
                self.answers += 1
                texts.append(f"<answer>{answer if self.answers % 2 else 'Nobody'}</answer>")
        replies = [self.tok(t, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id] for t in texts]
        return [Generation(r, [-0.5] * len(r), "stop") for r in replies]


def test_a_step_trains_proposer_rows_and_search_episodes_with_retrieved_tokens_masked(kb_dir, task):
    from reinforce_pro.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    sampler = Sampler([], tokenizer, RolloutConfig(max_new_tokens=40, prompt_max_len=64))
    sampler.sample = ScriptedPolicy(tokenizer, task)
    config = SelfPlayConfig(n_questions_per_prompt=2, max_repropose_attempts=1,
                            proposer_train_scope="group", weights={"completion": 1.0})  # fmt: skip
    source = SelfPlaySource(sampler, task, config, seed=0, max_len=512)
    samples = source.generate(task.seed_records(3, seed=2), 4)
    proposer = samples.rewards.extra_logs["proposer_frac"].bool()
    assert proposer.sum() == 3 * 2 and (~proposer).sum() == 3 * 4  # one update: every proposal, 4 episodes each
    m = samples.metrics
    assert m["selfplay/search/valid_ratio"] == 0.5 and m["unified_filter/learnable_ratio"] == 0.5
    assert m["selfplay/search/solver_searches_mean"] == 1.0 and m["selfplay/search/solver_hit_mean"] == 1.0
    assert m["selfplay/search/proposed_hops_mean"] == 1.0 and 0 < m["selfplay/search/proposed_subject_unique_frac"]
    assert 0 < m["agent/env_token_frac"] < 1 and m["agent/turns_mean"] == 2.0
    mask, width = samples.action_mask, samples.action_mask.shape[1]
    real = samples.attention_mask[:, -width:].bool()  # the response's tokens, padding excluded
    assert torch.equal(mask[proposer], real[proposer])  # a proposal is the model's throughout
    for row in (~proposer).nonzero().flatten().tolist():  # a search episode: the retrieved block is context only
        environment = samples.sequences[row, -width:][real[row] & ~mask[row]]
        text = tokenizer.decode(environment)
        assert text.startswith("\n<information>Doc 1(Title: ") and text.endswith("</information>\n")
        assert (samples.rollout_log_probs[row][~mask[row]] == 0).all()
    assert_masked_positions_do_not_matter(mask[~proposer])
    assert torch.equal(samples.rewards.scores[~proposer][:4], torch.tensor([1.0, 0.0, 1.0, 0.0]))


# ------------------------------------------------------------------------------------------ end to end
@pytest.mark.e2e
@pytest.mark.recipe
def test_search_selfplay_recipe_trains_both_roles_with_the_service_running(tmp_path):
    """examples/scripts/train_search_selfplay.sh as a user runs it, shortened: knowledge base, its service
    (started and stopped by the script), the task's warm start on other bases (400 SFT steps: enough for the
    proposer to copy the seed's person into a valid question), then two self-play steps whose update holds
    proposer rows and search episodes, the held-out ladder by hops before training and after each step. The
    task is the built-in one with every valid question learnable (tests/data/search_task_all_learnable.py):
    a solver this briefly warmed up is rarely right, and the built-in thresholds would keep no question."""
    import os
    import socket
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with socket.socket() as s:  # a free port for the service
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OUT": str(tmp_path), "STEPS": "2", "PROMPTS_PER_STEP": "4", "QUESTIONS": "2",
           "SAMPLES": "4", "REPROPOSE": "1", "ENTITIES": "24", "WARM_STEPS": "400", "WARM_TARGET": "0",
           "EVAL_STEPS": "1",
           "PORT": str(port), "TASK_PATH": str(root / "tests" / "data" / "search_task_all_learnable.py")}  # fmt: skip
    script = root / "examples" / "scripts" / "train_search_selfplay.sh"
    result = subprocess.run(["bash", str(script), "--micro_train_batch_size", "8"], env=env, capture_output=True,
                            text=True, timeout=1200)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"service up: {24 * 4} passages" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    ladder = [r for r in rows if "eval/ladder/accuracy_mean" in r]
    assert [r["step"] for r in ladder] == [0, 1, 2]
    assert {"eval/ladder/hops1/accuracy", "eval/ladder/hops2/accuracy"} <= set(ladder[0])
    steps = [r for r in rows if "unified_filter/num_total" in r]
    assert len(steps) == 2 and all("is/token_masked_frac" in r for r in steps)
    first = steps[0]  # the warm start copies the seed's person: some proposals are valid, and so learnable here
    assert first["selfplay/search/valid_ratio"] > 0 and first["unified_filter/num_sampled"] > 0
    assert 0 < first["reward/proposer_frac"] < 1  # one update: proposer rows and solver episodes
    assert first["selfplay/search/solver_searches_mean"] > 0  # the episodes searched the running service
    assert 0 < first["agent/env_token_frac"] < 1  # retrieved blocks: environment tokens, out of the loss
    with pytest.raises(RetrieverError, match="unreachable"):  # and the script stopped the service
        RetrieverClient(f"http://127.0.0.1:{port}", timeout=1, retries=0).health()
