"""Search-augmented multi-turn RL: the knowledge base's splits, the retrieval service's contract on
loopback (shape, errors, timeouts, concurrency), the search agent's parsing, and retrieved tokens kept out of the
loss and the IS correction."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from test_agents import ScriptedEngine

from reinforce_pro.agents.contract import load_agent_class
from reinforce_pro.agents.episode import episodes_to_samples
from reinforce_pro.agents.runner import AgentConfig, AgentRunner
from reinforce_pro.algos.losses import PolicyLoss
from reinforce_pro.search import knowledge
from reinforce_pro.search.retriever import BM25Index, RetrieverClient, RetrieverError, make_server

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "python"
pytest.importorskip("bm25s")


@pytest.fixture(scope="module")
def kb():
    return knowledge.build(entities=60, seed=3)


def serve(index, **kwargs):
    server = make_server(index, port=0, **kwargs)
    return server, server.start()


@pytest.fixture(scope="module")
def service(kb):
    server, url = serve(BM25Index(kb.passages))
    yield url
    server.stop()


# ------------------------------------------------------------------------------------------ knowledge base
def test_knowledge_base_is_seeded_and_its_splits_share_no_fact(kb):
    assert knowledge.build(entities=60, seed=3) == kb
    assert knowledge.build(entities=60, seed=4).passages != kb.passages
    assert len(kb.passages) == 60 * 4  # 3 facts + 1 distractor per person
    by_id = {p["id"]: p["contents"] for p in kb.passages}
    train_gold = {g for q in kb.train for g in q["gold"]}
    held_gold = {g for q in kb.heldout for g in q["gold"]}
    assert train_gold and held_gold and not train_gold & held_gold
    train_people = {by_id[g].split("\n")[0] for g in train_gold}
    assert not train_people & {by_id[g].split("\n")[0] for g in held_gold}
    for q in kb.train + kb.heldout:
        assert q["answer"] in by_id[q["gold"][-1]]  # the last gold passage states the answer
        assert json.loads(q["label"]) == {"answer": q["answer"], "gold": q["gold"]}
        if q["hops"] == 2:  # the first states the mentor, whose passage the second is
            mentor = by_id[q["gold"][0]].rsplit(" is ", 1)[1].rstrip(".")
            assert by_id[q["gold"][1]].startswith(mentor + "\n")
    assert {q["hops"] for q in kb.heldout} == {1, 2}


# ------------------------------------------------------------------------------------------ the service
def test_service_answers_search_r1_shape_best_first(kb, service):
    client = RetrieverClient(service)
    assert client.health() == {"status": "ok", "passages": len(kb.passages), "client_disconnects": 0}
    single = [q for q in kb.heldout if q["hops"] == 1]
    rows = client.retrieve([q["question"].rstrip("?") for q in single], topk=3)
    assert [len(r) for r in rows] == [3] * len(single)
    hits = sum(q["gold"][0] in {d["id"] for d in r} for q, r in zip(single, rows, strict=True))
    assert hits / len(single) >= 0.9  # BM25 finds the fact passage of a single-hop question
    body = json.dumps({"queries": ["home of nobody", single[0]["question"]], "topk": 2, "return_scores": True})
    raw = _post(service + "/retrieve", body.encode())
    assert set(raw) == {"result"} and len(raw["result"]) == 2
    scores = [h["score"] for h in raw["result"][1]]
    assert scores == sorted(scores, reverse=True) and set(raw["result"][1][0]["document"]) == {"id", "contents"}
    plain = _post(service + "/retrieve", json.dumps({"queries": ["x"], "topk": 1}).encode())
    assert set(plain["result"][0][0]) == {"id", "contents"}  # without return_scores: the documents


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b"{not json", 400, "not JSON"),
        (b"[1, 2]", 400, "must be an object"),
        (b'{"queries": "home"}', 400, "non-empty list of strings"),
        (b'{"queries": []}', 400, "non-empty list of strings"),
        (b'{"queries": ["a"], "topk": 0}', 400, "topk"),
        (b'{"queries": ["a"], "topk": true}', 400, "topk"),
        (b'{"queries": ["a"], "topk": 500}', 400, "topk"),
        (b"x" * ((1 << 20) + 1), 413, "at most"),
        (b"[" * 50_000 + b"]" * 50_000, 400, "nested too deeply"),  # once an uncaught RecursionError: no answer
    ],
    ids=[
        "bad-json",
        "not-object",
        "queries-str",
        "queries-empty",
        "topk-0",
        "topk-bool",
        "topk-big",
        "too-large",
        "deep-nesting",
    ],
)
def test_service_refuses_malformed_requests_with_a_json_error(service, body, status, message):
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(service + "/retrieve", data=body), timeout=5)
    assert info.value.code == status and message in json.loads(info.value.read())["error"]


@pytest.mark.parametrize("declared", ["abc", "-1", "\u00b2"])
def test_service_refuses_a_bad_content_length(service, declared):
    import http.client

    port = int(service.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.putrequest("POST", "/retrieve")
    connection.putheader("Content-Length", declared)
    connection.endheaders()
    response = connection.getresponse()  # answered at once (by the HTTP parser): no hang waiting for a body
    assert response.status == 400
    connection.close()
    assert RetrieverClient(service).health()["status"] == "ok"


def test_client_errors_are_one_line_naming_the_url(kb):
    with pytest.raises(RetrieverError, match=r"is unreachable .*is it running\?") as info:
        RetrieverClient("http://127.0.0.1:9", timeout=1).health()  # nothing listens on the discard port
    assert "\n" not in str(info.value)
    garbage, url = serve(_Garbage(), max_concurrency=2)
    try:
        with pytest.raises(RetrieverError, match="outside the contract"):
            RetrieverClient(url).retrieve(["q"])
    finally:
        garbage.stop()


def test_timeout_and_bounded_concurrency(kb):
    slow = _Slow(BM25Index(kb.passages), seconds=1.5)
    server, url = serve(slow, max_concurrency=1, queue_timeout=0.2)
    try:
        with pytest.raises(RetrieverError, match="unreachable"):  # the client gives up after its timeout
            RetrieverClient(url, timeout=0.5, retries=0).retrieve(["home"])
        time.sleep(1.5)
        results, errors = _at_once(url, 3)
        assert len(results) == 1 and len(errors) == 2  # one slot: the others wait 0.2 s, then 503
        assert all("HTTP 503" in e and "busy" in e for e in errors)
        assert slow.max_in_flight == 1
    finally:
        server.stop()


def _at_once(url: str, n: int) -> tuple[list, list[str]]:
    """`n` retrievals from `n` threads at once: (the results, the errors' messages)."""
    results, errors = [], []

    def call():
        try:
            results.append(RetrieverClient(url, timeout=5, retries=0).retrieve(["home"]))
        except RetrieverError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def _closed_by_server(sock, within: float) -> bool:
    """True when the server closes `sock` (recv gives b"" or a reset) within `within` seconds."""

    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_and_slow_connections_are_closed_and_take_no_slot(kb):
    """300 silent connections and one whose body stops coming: a real request is still answered at once (the
    thread-per-connection service this replaced refused it until its idle timeout freed a slot), the silent
    ones are closed after the idle timeout, the stalled body ends with 408, and no thread is made for any."""
    import socket

    server, url = serve(BM25Index(kb.passages), idle_timeout=0.5)
    port = server.port
    try:
        before = threading.active_count()
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(300)]
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"queries"')
        started = time.perf_counter()
        assert RetrieverClient(url, timeout=5, retries=0).retrieve(["home"], topk=1)
        assert time.perf_counter() - started < 0.4  # at once, not after the idle timeout
        assert threading.active_count() - before <= 2  # the search's worker thread at most, none per connection
        slow.settimeout(3.0)
        assert b" 408 " in slow.recv(4096)  # the body that stopped: refused after the idle timeout
        assert all(_closed_by_server(s, within=3.0) for s in silent[:20])  # the silent ones: closed
        for s in [*silent, slow]:
            s.close()
        assert RetrieverClient(url).retrieve(["home"], topk=1)
    finally:
        server.stop()


def test_clients_that_hang_up_mid_body_are_counted_not_logged(kb, caplog):
    """Forty clients that send half a body and close: no "Exception in ASGI application" traceback (it once
    filled a pipe nobody read and stalled the event loop), each counted in /health, and the service answers."""
    import logging
    import socket

    server, url = serve(BM25Index(kb.passages))
    try:
        with caplog.at_level(logging.INFO):
            for _ in range(40):
                sock = socket.create_connection(("127.0.0.1", server.port))
                sock.sendall(b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"queries"')
                sock.close()
            deadline = time.monotonic() + 5
            while RetrieverClient(url).health()["client_disconnects"] < 40 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert RetrieverClient(url).health()["client_disconnects"] == 40
        assert not [r for r in caplog.records if r.exc_info or "Exception" in r.getMessage()]
        assert RetrieverClient(url).retrieve(["home"], topk=1)
    finally:
        server.stop()


def test_the_command_line_says_its_url_once_it_accepts_connections(kb, tmp_path):
    """`python -m reinforce_pro.search.retriever`: a script that connects on the "serving" line is answered."""
    import subprocess
    import sys

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in kb.passages))
    process = subprocess.Popen([sys.executable, "-m", "reinforce_pro.search.retriever", "--corpus", str(corpus),
                                "--port", "0"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = process.stdout.readline()
        served = line.split("serving ")[1].split()[0]
        assert RetrieverClient(served, retries=0).health()["status"] == "ok"  # at once: no retry, no sleep
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_more_requests_than_max_connections_get_503_at_once(kb):
    slow = _Slow(BM25Index(kb.passages), seconds=1.0)
    server, url = serve(slow, max_concurrency=8, max_connections=2)
    try:
        _, errors = _at_once(url, 4)
        assert len(errors) == 2 and all("HTTP 503" in e for e in errors) and slow.max_in_flight == 2
    finally:
        server.stop()


class _Slow:
    def __init__(self, index, seconds):
        self.index, self.seconds, self.passages = index, seconds, index.passages
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()

    def search(self, queries, topk):
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(self.seconds)
        with self.lock:
            self.in_flight -= 1
        return self.index.search(queries, topk)


class _Garbage:
    passages = [{"id": "0", "contents": "x"}]

    def search(self, queries, topk):
        return [[({"id": "0"}, 1.0)]]  # a document without contents


def _post(url: str, body: bytes) -> dict:
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=5) as response:
        return json.loads(response.read())


# ------------------------------------------------------------------------------------------ the agent
@pytest.fixture(scope="module")
def tokenizer():
    from reinforce_pro.models.tiny import build_tokenizer

    return build_tokenizer()


def load_search_agent(monkeypatch, url: str, **env):
    monkeypatch.setenv("SEARCH_RETRIEVER_URL", url)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    return load_agent_class(EXAMPLES / "agent_search.py")


def run_dialogue(agent, tokenizer, prompt: str, label: str, replies: list[str], turns: int = 4):
    engine = ScriptedEngine(tokenizer, {prompt: replies})
    runner = AgentRunner(agent, tokenizer, engine, {"max_tokens": 64}, AgentConfig(max_turns=turns, max_len=512))
    (episode,) = runner.run_episodes([{"prompt": prompt, "label": label}], n=1)
    return episode


def test_agent_searches_then_answers(kb, service, tokenizer, monkeypatch):
    agent = load_search_agent(monkeypatch, service, SEARCH_TOPK=2)
    q = next(q for q in kb.train if q["hops"] == 1)
    person = q["question"].split(" of ")[-1].rstrip("?")
    replies = [f"<search>{q['question'].split(' of ')[0]} of {person}</search>", f"<answer>{q['answer']}</answer>"]
    e = run_dialogue(agent, tokenizer, q["question"], q["label"], replies)
    text = tokenizer.decode(e.tokens)
    info = text[text.index("<information>") : text.index("</information>") + len("</information>")]
    assert info.startswith("<information>Doc 1(Title: ") and "Doc 2(Title: " in info and q["answer"] in info
    assert e.turn_rewards == [0.0, 1.0] and e.done
    assert {k: sum(v) for k, v in e.extra_logs.items()} == {
        "searches": 1.0, "searched": 1.0, "hit": 1.0, "correct": 1.0, "invalid": 0.0}  # fmt: skip
    env = [i for i, a in enumerate(e.action) if not a]  # the information block (and its newlines) is environment
    assert tokenizer.decode([e.tokens[i] for i in env]) == f"\n{info}\n"


@pytest.mark.parametrize(
    "replies, rewards, logs",
    [
        (["<search>home", "<answer>x</answer>"], [0.0, 0.0], {"invalid": 1.0, "correct": 0.0}),
        (["<search>  </search>", "<answer>x</answer>"], [0.0, 0.0], {"invalid": 1.0}),
        (["<answer>" + "y" * 65 + "</answer>"], [0.0], {"correct": 0.0}),
        (["<answer>THE  Plent.</answer>"], [1.0], {"correct": 1.0}),  # normalised: case, articles, punctuation
        (
            ["<search>a</search>"] * 3 + ["<answer>Plent</answer>"],
            [0.0, 0.0, 0.0, 1.0],
            {"searches": 2.0, "invalid": 1.0},
        ),
    ],
    ids=["unclosed-tag", "empty-query", "over-long-answer", "normalised-answer", "search-budget"],
)
def test_agent_handles_malformed_and_over_budget_turns(service, tokenizer, monkeypatch, replies, rewards, logs):
    agent = load_search_agent(monkeypatch, service, SEARCH_MAX_SEARCHES=2)
    e = run_dialogue(agent, tokenizer, "home of Zorvik?", "Plent", replies)
    assert e.turn_rewards == rewards
    totals = {k: sum(v) for k, v in e.extra_logs.items()}
    assert {k: totals[k] for k in logs} == logs
    text = tokenizer.decode(e.tokens)
    if logs.get("invalid"):
        assert "<information>invalid" in text or "no more searches" in text


def test_information_is_cut_to_its_budget(service, tokenizer, monkeypatch):
    agent = load_search_agent(monkeypatch, service, SEARCH_INFO_CHARS=30, SEARCH_TOPK=3)
    e = run_dialogue(agent, tokenizer, "q?", "a", ["<search>home</search>", "<answer>a</answer>"])
    text = tokenizer.decode(e.tokens)
    body = text[text.index("<information>") + len("<information>") : text.index("</information>")]
    assert len(body) == 30


def test_a_down_retriever_stops_the_episode_with_one_line(tokenizer, monkeypatch):
    agent = load_search_agent(monkeypatch, "http://127.0.0.1:9", SEARCH_TIMEOUT=1)
    with pytest.raises(RetrieverError, match="is unreachable"):
        run_dialogue(agent, tokenizer, "q?", "a", ["<search>home</search>"])


def test_retrieved_text_changes_neither_the_loss_nor_the_is_metrics(kb, tokenizer, monkeypatch):
    """Two services whose passages differ in text (same lengths): the episodes' model tokens and action masks are
    the same, and with the model's log-probs on the model tokens, anything on the retrieved ones, the loss, its
    gradient on the model tokens and every is/* metric are identical."""

    def swap(contents: str) -> str:  # another value of the same length: the same words for BM25, other text
        head, sep, value = contents.rpartition(" is ")
        return head + sep + value.rstrip(".")[::-1].capitalize() + "." if sep else contents

    swapped = [{**p, "contents": swap(p["contents"])} for p in kb.passages]
    episodes = []
    for passages in (kb.passages, swapped):
        server, url = serve(BM25Index(passages))
        try:
            agent = load_search_agent(monkeypatch, url)
            replies = ["<search>tool</search>", "<answer>a</answer>"]
            episodes.append(run_dialogue(agent, tokenizer, "tool of X?", "a", replies))
        finally:
            server.stop()
    samples = [episodes_to_samples([e], tokenizer.pad_token_id, [""], "sum") for e in episodes]
    a, b = samples
    assert torch.equal(a.action_mask, b.action_mask) and not torch.equal(a.sequences, b.sequences)
    assert (~a.action_mask).sum() > 40  # the information block is there, masked
    assert_masked_positions_do_not_matter(a.action_mask)


def assert_masked_positions_do_not_matter(mask: torch.Tensor) -> None:
    """With the model's log-probs on the action tokens of `mask` and anything (0 or NaN) elsewhere, the
    reinforce_pro loss, its gradient on the action tokens and every is/* metric are identical."""
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(mask.shape, generator=gen, dtype=torch.float64)
    rollout = old - 0.6 * torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    advantages = torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    loss_fn = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type="reinforce_pro",
                         vllm_is_truncated_threshold=[0.8, 1.25])  # fmt: skip
    results = []
    for junk in (0.0, float("nan")):  # what the masked positions hold must not matter
        fill = lambda t, junk=junk: torch.where(mask, t, torch.full_like(t, junk))  # noqa: E731
        log_probs = fill(old + 0.1).requires_grad_()
        loss, metrics = loss_fn(
            log_probs, fill(old), fill(advantages), action_mask=mask, rollout_log_probs=fill(rollout)
        )
        loss.backward()
        results.append((float(loss), log_probs.grad[mask].clone(), {k: float(v) for k, v in metrics.items()}))
    assert results[0][0] == results[1][0] and torch.equal(results[0][1], results[1][1])
    assert results[0][2] == results[1][2]
    assert 0 < results[0][2]["is/token_masked_frac"] < 1  # the band masks some model tokens: the check can fail


# ------------------------------------------------------------------------------------------ end to end
@pytest.mark.e2e
# CI runs the AgentInstance shape: the only run of search training end to end; the SDK shape of an agent trains in
# CI's end-to-end tier through tests/test_e2e.py, so its run here is a recipe test
@pytest.mark.parametrize("agent", ["agent_search.py", pytest.param("agent_search_openai.py", marks=pytest.mark.recipe)])
def test_search_recipe_trains_with_the_service_running(tmp_path, agent):
    """examples/scripts/train_search_agent.sh as a user runs it, shortened: knowledge base, its service (started
    and stopped by the script), a short warm start on demonstrations (50 steps: the model already searches, about
    once per episode, though rarely right; 200 took 80 s more), two RL steps with the search agent, as an
    AgentInstance file and as the same agent written to the OpenAI SDK (AGENT=...: through the run's endpoint)."""
    import socket
    import subprocess

    if agent.endswith("_openai.py"):
        pytest.importorskip("openai")
    script = Path(__file__).resolve().parents[1] / "examples" / "scripts" / "train_search_agent.sh"
    with socket.socket() as s:  # a free port for the service
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OUT": str(tmp_path), "STEPS": "2", "PROMPTS_PER_STEP": "4", "ENTITIES": "24",
           "WARM_STEPS": "50", "PORT": str(port), "AGENT": str(EXAMPLES / agent)}  # fmt: skip
    result = subprocess.run(["bash", str(script), "--micro_train_batch_size", "16"], env=env, capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"service up: {24 * 4} passages" in result.stdout
    rows = [json.loads(line) for line in next(tmp_path.rglob("metrics.jsonl")).read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert {"reward/searches", "reward/searched", "reward/hit", "reward/correct"} <= set(row)
        assert 0 < row["agent/env_token_frac"] < 1 and "is/token_masked_frac" in row
        if agent.endswith("_openai.py"):  # the SDK path's own counters: every episode trained, none forked
            assert row["agent/dropped_episodes"] == 0 and row["agent/segment_forks"] == 0
    assert max(r["reward/searches"] for r in rows) > 0  # the warm-started model searches: the service answered
    with pytest.raises(RetrieverError, match="unreachable"):  # and the script stopped it
        RetrieverClient(f"http://127.0.0.1:{port}", timeout=1, retries=0).health()


# ------------------------------------------------------------------------------------------ warm start
def test_extra_knowledge_bases_bring_new_names_and_none_of_the_evaluated_base(kb):
    """The warm start's extra bases (they teach copying unseen names): questions of other bases, each answered
    by its own index, and no question that names a name of the base under evaluation."""
    from reinforce_pro.search.demonstrations import NAME, extra_questions

    base_names = set(NAME.findall(" ".join(p["contents"] for p in kb.passages)))
    extra = extra_questions(kb.passages, 2, seed=3)
    assert extra_questions(kb.passages, 0, seed=3) == []
    assert len({id(index) for _, index in extra}) == 2
    assert len(extra) > 1.5 * len(kb.train + kb.heldout)  # two bases' questions, few or none left out
    for row, index in extra:
        assert base_names.isdisjoint(NAME.findall(f"{row['question']} {row['answer']}"))
        (hits,) = index.search([row["question"].rstrip("?")], 2)
        assert any(row["answer"] in doc["contents"] or " of mentor of " in row["question"] for doc, _ in hits)
    # a base that shares a name with an extra one loses the questions naming it (same people: same extra base)
    clash = NAME.findall(extra[0][0]["question"])[0]
    person = kb.passages[0]["contents"].split("\n")[0]
    shared = [{"id": "x", "contents": f"{person}\n{person} met {clash}."}, *kb.passages[1:]]
    kept = extra_questions(shared, 2, seed=3)
    assert 0 < len(kept) < len(extra) and all(clash not in f"{r['question']} {r['answer']}" for r, _ in kept)


def test_demonstrations_lay_out_episodes_as_the_runner_does(kb, tokenizer):
    """A two-hop demonstration: question, search (trained, ends with EOS), the index's real answer (context),
    the bridge search, its answer, the answer turn; and the SFT batch trains exactly the model turns."""
    from reinforce_pro.search.demonstrations import demonstration, search_plan
    from reinforce_pro.trainer.sft_warmup import _pad_sequences

    index = BM25Index(kb.passages)
    row = next(q for q in kb.train if q["hops"] == 2)
    by_id = {p["id"]: p["contents"] for p in kb.passages}
    queries = search_plan(row, by_id)
    mentor = by_id[row["gold"][0]].rsplit(" is ", 1)[1].rstrip(".")
    assert queries[1].endswith(f" of {mentor}") and queries[0].startswith("mentor of ")
    ids, trained = demonstration(row, index, tokenizer, topk=2, info_chars=110)
    turns, current = [], []
    for token, is_model in zip(ids, trained, strict=True):  # split into runs of model / context tokens
        if current and current[-1][1] != is_model:
            turns.append(current)
            current = []
        current.append((token, is_model))
    turns.append(current)
    model_turns = [tokenizer.decode([t for t, _ in turn]) for turn in turns if turn[0][1]]
    eos = tokenizer.eos_token
    assert model_turns == [f"<search>{queries[0]}</search>{eos}", f"<search>{queries[1]}</search>{eos}",
                           f"<answer>{row['answer']}</answer>{eos}"]  # fmt: skip
    context = tokenizer.decode([t for t, m in zip(ids, trained, strict=True) if not m])
    assert context.count("<information>") == 2 and mentor in context and row["answer"] in context
    batch_ids, attention, labels = _pad_sequences([(ids, trained), (ids[:10], trained[:10])], tokenizer.pad_token_id)
    assert torch.equal(labels[0] != -100, torch.tensor(trained)) and attention[1].sum() == 10
    assert torch.equal(batch_ids[0], torch.tensor(ids)) and (labels[1] == -100).all()  # no model token in 10
