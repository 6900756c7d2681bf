"""Agents written to the OpenAI SDK (agents/openai_endpoint.py, openai_app.py, openai_agents.py, trajectory.py):
the real `openai` client against the live loopback endpoint, with a scripted engine (its ids and log-probs known),
so that every id of every trained row can be checked against what the engine sampled. The real engine's
token-exactness and a training run are in tests/test_e2e.py."""

from __future__ import annotations

import asyncio
import copy
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from reinforce_pro.agents.agent_file import load_agent  # noqa: E402
from reinforce_pro.agents.contract import AgentFileError  # noqa: E402
from reinforce_pro.agents.openai_agents import OpenAIAgent, OpenAIAgentSource  # noqa: E402
from reinforce_pro.agents.openai_app import MAX_BODY_BYTES  # noqa: E402
from reinforce_pro.agents.openai_endpoint import Endpoint  # noqa: E402
from reinforce_pro.agents.runner import AgentConfig  # noqa: E402
from reinforce_pro.rollout.sampler import RolloutConfig  # noqa: E402
from reinforce_pro.rollout.vllm_engine import Generation  # noqa: E402
from reinforce_pro.serving import service_restarts  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "python"
RUN_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 12, "skip_special_tokens": False}


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    from reinforce_pro.models.tiny import build_tokenizer

    return build_tokenizer()


class ScriptedEngine:
    """Replies to a prompt with the next scripted text for the longest key its decoded prompt ends with, ending
    in <eos> unless the reply says "~" (then finish "length"); log-prob -0.01 * (call number) per token."""

    def __init__(self, tokenizer, replies: dict[str, list[str]], delay_s: float = 0.0):
        self.tok, self.replies, self.delay_s = tokenizer, {k: list(v) for k, v in replies.items()}, delay_s
        self.calls: list[int] = []  # prompts per engine call
        self.given: list[list[int]] = []  # every prompt's ids, in order
        self.sampled: list[Generation] = []
        self.temperatures: list[float] = []  # each call's

    def __call__(self, prompt_ids: list[list[int]], sampling: dict) -> list[Generation]:
        time.sleep(self.delay_s)
        self.calls.append(len(prompt_ids))
        self.temperatures.append(sampling["temperature"])
        out = []
        for ids in prompt_ids:
            text = self.tok.decode(ids, skip_special_tokens=True)
            key = max((k for k in self.replies if k in text), key=len)
            reply = self.replies[key].pop(0) if len(self.replies[key]) > 1 else self.replies[key][0]
            length = reply.endswith("~")
            token_ids = self.tok(reply.rstrip("~"), add_special_tokens=False)["input_ids"]
            token_ids = token_ids[: sampling["max_tokens"]] + ([] if length else [self.tok.eos_token_id])
            g = Generation(token_ids, [-0.01 * len(self.sampled) - 0.001 * i for i in range(len(token_ids))],
                           "length" if length else "stop")  # fmt: skip
            self.given.append(list(ids))
            self.sampled.append(g)
            out.append(g)
        return out


def source_for(tokenizer, engine, agent: OpenAIAgent, max_len: int = 128, max_new: int = 24, solver_only: bool = False):
    cfg = RolloutConfig(max_new_tokens=max_new)
    sampler = SimpleNamespace(cfg=cfg, tokenizer=tokenizer, sample=engine)
    return OpenAIAgentSource(sampler, agent, AgentConfig(max_len=max_len), solver_only=solver_only)


def prompt_of(samples, row: int) -> list[int]:
    """The row's prompt ids, left padding removed."""
    t = samples.num_actions
    return samples.sequences[row, :-t][samples.attention_mask[row, :-t] == 1].tolist()


def agent_file(tmp_path: Path, body: str) -> OpenAIAgent:
    path = tmp_path / "agent.py"
    path.write_text(body)
    agent = load_agent(path)
    assert isinstance(agent, OpenAIAgent)
    return agent


# ---------------------------------------------------------------------------------------------- the SDK, live
def test_calculator_written_to_the_sdk_trains_the_ids_the_engine_sampled(tokenizer):
    engine = ScriptedEngine(tokenizer, {"3+4=": ["calc(3+4)", "7"], "5+5=": ["10"]})
    source = source_for(tokenizer, engine, load_agent(EXAMPLES / "agent_calculator_openai.py"))
    try:
        samples = source.generate([{"prompt": "3+4=", "label": "7"}, {"prompt": "5+5=", "label": "10"}], 1)
    finally:
        source.close()
    assert engine.calls == [2, 1]  # turn 1 of both episodes in one engine call, then the live one
    assert samples.rewards.rewards.tolist() == pytest.approx([0.8, 1.0])
    assert samples.metrics["agent/segment_forks"] == 0 and samples.metrics["agent/rows"] == 2
    # row 0, bit for bit: prompt <bos>3+4=, the engine's first reply (with its <eos>), the tool's text, the answer
    start = [tokenizer.bos_token_id] + tokenizer("3+4=")["input_ids"]
    (given1, first), (given2, answer) = [
        (g, s) for g, s in zip(engine.given, engine.sampled, strict=True) if g[:5] == start
    ]
    feedback = tokenizer(" -> 7; answer: ", add_special_tokens=False)["input_ids"]
    want = first.token_ids + feedback + answer.token_ids
    response = samples.sequences[0, -samples.num_actions :][: len(want)]
    assert response.tolist() == want and given2 == given1 + first.token_ids + feedback
    assert samples.action_mask[0, : len(want)].tolist() == [True] * len(first.token_ids) + [False] * len(
        feedback
    ) + [True] * len(answer.token_ids)  # fmt: skip
    lp = torch.tensor(first.log_probs + [0.0] * len(feedback) + answer.log_probs, dtype=torch.float32)
    torch.testing.assert_close(samples.rollout_log_probs[0, : len(want)], lp, rtol=0, atol=0)  # as stored
    assert prompt_of(samples, 0) == given1 == start


def test_an_episode_that_runs_out_of_room_ends_unanswered_not_dropped(tokenizer):
    """The endpoint refuses a prompt over --max_len with context_length_exceeded; the example agent ends there."""
    engine = ScriptedEngine(tokenizer, {"3+4=": ["calc(3+4)"]})
    source = source_for(tokenizer, engine, load_agent(EXAMPLES / "agent_calculator_openai.py"), max_len=40)
    try:
        samples = source.generate([{"prompt": "3+4=", "label": "7"}], 1)
    finally:
        source.close()
    assert samples.metrics["agent/dropped_episodes"] == 0 and samples.rewards.rewards.tolist() == [0.0]
    assert 1 <= samples.metrics["agent/calls_mean"] < 4  # it called until the prompt no longer fit


def test_partial_rollouts_keep_the_version_that_sampled_each_token(tokenizer):
    """--partial_rollout: the endpoint samples in chunks (Sampler.sample_in_chunks) on the thread that called
    generate() (it holds the engine gate that lets syncs in between chunks); each trained token keeps the weight
    version its chunk was sampled with, the environment's the version before them."""
    from reinforce_pro.rollout.sampler import PartialRollout

    engine = ScriptedEngine(tokenizer, {"3+4=": ["calc(3+4)", "7"]})
    chunks = []

    def sample_in_chunks(prompts, partial, sampling):
        assert threading.current_thread() is threading.main_thread()  # the gate holder's thread, not the server's
        version = partial.between(0)
        out = engine(prompts, sampling)
        chunks.append(version)
        return out, [[version] * (len(g.token_ids) - 1) + [version + 1] for g in out]  # a sync before the last

    source = source_for(tokenizer, engine, load_agent(EXAMPLES / "agent_calculator_openai.py"))
    source.sampler.sample_in_chunks = sample_in_chunks
    versions = iter(range(10, 20, 5))
    source.use_partial(PartialRollout(chunk=4, between=lambda chunk: next(versions)))
    try:
        samples = source.generate([{"prompt": "3+4=", "label": "7"}], 1)
    finally:
        source.close()
    first, answer = engine.sampled
    feedback = len(tokenizer(" -> 7; answer: ", add_special_tokens=False)["input_ids"])
    want = [10] * (len(first.token_ids) - 1) + [11] + [11] * feedback + [15] * (len(answer.token_ids) - 1) + [16]
    assert chunks == [10, 15] and samples.token_version[0, : len(want)].tolist() == want


class ContinuingEngine:
    """Like vLLM: continues one scripted reply from wherever the prompt has reached in it (a partial rollout's
    next chunk feeds the tokens so far as prompt), and stops at a stop string only where its own new text holds
    it whole, at the token that completes it (vLLM's detokenizer sees no text of the request before it)."""

    def __init__(self, tokenizer, base: str, reply: str):
        self.tok, self.base, self.reply = tokenizer, base, reply
        self.requests = 0

    def __call__(self, prompt_ids: list[list[int]], sampling: dict) -> list[Generation]:
        out, reply = [], self.tok(self.reply, add_special_tokens=False)["input_ids"]
        for ids in prompt_ids:
            self.requests += 1
            text = self.tok.decode(ids, skip_special_tokens=True)
            done = len(text) - text.index(self.base) - len(self.base)  # one character a token
            new, finish = reply[done : done + sampling["max_tokens"]], "length"
            for k in range(1, len(new) + 1):
                if any(stop in self.tok.decode(new[:k]) for stop in sampling.get("stop") or ()):
                    new, finish = new[:k], "stop"
                    break
            out.append(Generation(new, [-0.5] * len(new), finish))
        return out


@pytest.mark.parametrize(
    "body, reply, kept",
    [
        pytest.param({"stop": ["##"]}, "abc##def ghijklmnop", "abc##", id="stop-string"),
        pytest.param({"tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": False},
                     '<tool_call>{"name": "f"}</tool_call><tool_call>{"name": "f"}</tool_call>',
                     '<tool_call>{"name": "f"}</tool_call>', id="parallel-tool-calls-false"),
    ],
)  # fmt: skip
def test_under_partial_rollouts_nothing_past_a_stop_split_across_chunks_is_recorded(tokenizer, body, reply, kept):
    """Sampled 4 tokens a request (Sampler.sample_in_chunks, not a stand-in), a stop string (or a call's closing
    tag, parallel_tool_calls false) split across two chunks: the ids recorded, trained and fed to the next turn
    end at it, as the text the client got does."""
    from reinforce_pro.rollout.sampler import PartialRollout, Sampler

    engine = ContinuingEngine(tokenizer, "user: go\nassistant: ", reply)
    sampler = Sampler(None, tokenizer, RolloutConfig(max_new_tokens=40))
    sampler.sample = engine
    endpoint = Endpoint(tokenizer, engine, {**RUN_SAMPLING, "max_tokens": 40}, max_len=256, batch_wait_s=0.01)
    partial = PartialRollout(chunk=4, between=lambda chunk: 0)
    endpoint.batcher.chunked = lambda prompts, sampling: sampler.sample_in_chunks(prompts, partial, sampling)
    endpoint.start()
    try:
        sid = endpoint.open_session()
        r = post(endpoint, f"/s/{sid}/v1/chat/completions", json={**CHAT, "messages": [
            {"role": "user", "content": "go"}], **body})  # fmt: skip
        assert r.status_code == 200 and engine.requests >= 2  # chunked: several requests for one completion
        (call,) = endpoint.close_session(sid).trajectory.segments[0]
        assert tokenizer.decode(call.completion_ids) == kept and call.finish_reason == "stop"
        assert len(call.log_probs) == len(call.versions) == len(call.completion_ids)
        assert r.json()["token_ids"]["completion_token_ids"] == call.completion_ids
    finally:
        endpoint.stop()


def test_the_same_episode_as_its_agentinstance_twin(tokenizer):
    """The SDK calculator and agent_calculator.py's AgentInstance, on one scripted engine: the same rows."""
    from reinforce_pro.agents.agent_source import AgentSource
    from reinforce_pro.agents.contract import load_agent_class
    from reinforce_pro.experience import concat_samples

    script = {"3+4=": ["calc(3+4)", "7"], "5+5=": ["9"]}
    batch = [{"prompt": "3+4=", "label": "7"}, {"prompt": "5+5=", "label": "10"}]
    sdk_engine, twin_engine = ScriptedEngine(tokenizer, script), ScriptedEngine(tokenizer, script)
    sdk = source_for(tokenizer, sdk_engine, load_agent(EXAMPLES / "agent_calculator_openai.py"))
    try:  # one prompt a call: the scripted log-probs follow the order the engine sees the requests in
        a = concat_samples([sdk.generate([item], 1) for item in batch])
    finally:
        sdk.close()
    sampler = SimpleNamespace(cfg=RolloutConfig(max_new_tokens=12), tokenizer=tokenizer, sample=twin_engine)
    twin = AgentSource(sampler, load_agent_class(EXAMPLES / "agent_calculator.py"), AgentConfig(max_len=128))
    b = concat_samples([twin.generate([item], 1) for item in batch])
    for name in ("sequences", "attention_mask", "action_mask", "rollout_log_probs"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0)
    assert a.rewards.rewards.tolist() == b.rewards.rewards.tolist()


def test_the_search_agent_written_to_the_sdk_is_its_agentinstance_twin(tokenizer, monkeypatch):
    """examples/python/agent_search_openai.py against agent_search.py, one scripted search-then-answer episode
    per question against one live retrieval service: the same rows, rewards and per-episode logs."""
    pytest.importorskip("bm25s")
    from reinforce_pro.agents.agent_source import AgentSource
    from reinforce_pro.agents.contract import load_agent_class
    from reinforce_pro.experience import concat_samples
    from reinforce_pro.search import knowledge
    from reinforce_pro.search.retriever import BM25Index, make_server

    kb = knowledge.build(entities=20, seed=3)
    server = make_server(BM25Index(kb.passages), port=0)
    monkeypatch.setenv("SEARCH_RETRIEVER_URL", server.start())
    monkeypatch.setenv("SEARCH_TOPK", "2")
    questions = [q for q in kb.train if q["hops"] == 1][:2]
    script = {q["question"]: [f"<search>{q['question'].rstrip('?')}</search>", f"<answer>{q['answer']}</answer>"]
              for q in questions}  # fmt: skip
    script[questions[1]["question"]][1] = "<answer>nobody</answer>"  # one right, one wrong
    batch = [{"prompt": q["question"], "label": q["label"]} for q in questions]
    sdk_engine, twin_engine = ScriptedEngine(tokenizer, script), ScriptedEngine(tokenizer, script)
    sdk = source_for(tokenizer, sdk_engine, load_agent(EXAMPLES / "agent_search_openai.py"), 512, max_new=64)
    try:  # one question a call: the scripted log-probs follow the order the engine sees the requests in
        a = concat_samples([sdk.generate([item], 1) for item in batch])
        sampler = SimpleNamespace(cfg=RolloutConfig(max_new_tokens=64), tokenizer=tokenizer, sample=twin_engine)
        twin = AgentSource(sampler, load_agent_class(EXAMPLES / "agent_search.py"), AgentConfig(max_len=512))
        b = concat_samples([twin.generate([item], 1) for item in batch])
    finally:
        sdk.close()
        server.stop()
    for name in ("sequences", "attention_mask", "action_mask", "rollout_log_probs"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0)
    assert a.rewards.rewards.tolist() == b.rewards.rewards.tolist() == [1.0, 0.0]
    for key in ("searches", "searched", "hit", "correct", "invalid"):
        assert a.rewards.extra_logs[key].tolist() == b.rewards.extra_logs[key].tolist(), key
    assert a.rewards.extra_logs["searches"].tolist() == [1.0, 1.0]
    assert "<information>Doc 1(Title: " in tokenizer.decode(a.sequences[0])  # the service's passages, in the row


# ------------------------------------------------------------------------------------ held-out evaluation
def test_held_out_episodes_of_both_agent_shapes_score_alike_at_the_eval_temperature(tokenizer):
    """--eval_dataset with --agent_func_path: the SDK calculator and its AgentInstance twin, on one script, give
    the same eval metrics, sampled at the eval temperature; the endpoint is back at the run's afterwards."""
    from reinforce_pro.agents.agent_source import AgentSource
    from reinforce_pro.agents.contract import load_agent_class
    from reinforce_pro.trainer.evaluation import evaluate_agent

    script = {"3+4=": ["calc(3+4)"], "answer: ": ["7"], "5+5=": ["9"], "2+2=": ["4"]}
    prompts = [{"prompt": "3+4=", "label": "7"}, {"prompt": "5+5=", "label": "10"}, {"prompt": "2+2=", "label": "4"}]
    sdk_engine, twin_engine = ScriptedEngine(tokenizer, script), ScriptedEngine(tokenizer, script)
    sdk = source_for(tokenizer, sdk_engine, load_agent(EXAMPLES / "agent_calculator_openai.py"))
    try:
        a = evaluate_agent(sdk, None, prompts, "held", 2, temperature=0.25)
        assert sdk.endpoint.sampling["temperature"] == 1.0
    finally:
        sdk.close()
    sampler = SimpleNamespace(cfg=RolloutConfig(max_new_tokens=12), tokenizer=tokenizer, sample=twin_engine)
    twin = AgentSource(sampler, load_agent_class(EXAMPLES / "agent_calculator.py"), AgentConfig(max_len=128))
    b = evaluate_agent(twin, None, prompts, "held", 2, temperature=0.25)
    # per prompt: tool then right (0.8, score 1), wrong (0, 0), right at once (1, 1); two episodes each
    assert a["eval/held/pass@2"] == b["eval/held/pass@2"] == pytest.approx(2 / 3)
    assert a["eval/held/score_mean"] == b["eval/held/score_mean"] == pytest.approx(2 / 3)
    assert a["eval/held/reward_mean"] == b["eval/held/reward_mean"] == pytest.approx(1.8 / 3)
    assert a["eval/held/response_length_mean"] == b["eval/held/response_length_mean"]
    assert a["eval/held/num_prompts"] == 3
    assert a["eval/held/logs/tool_calls"] == pytest.approx(1 / 3)  # the SDK agent's extra_logs: 2 of 6 episodes
    assert set(sdk_engine.temperatures) == set(twin_engine.temperatures) == {0.25}


def test_a_held_out_episode_that_fails_scores_zero_and_a_missing_reward_goes_to_the_reward_function(
    tokenizer, tmp_path
):
    agent = agent_file(tmp_path, """
async def run_agent(client, prompt, label):
    reply = await client.completions.create(model="policy", prompt=prompt)
    if prompt == "boom":
        raise RuntimeError("the tool is down")
    return {"extra_logs": {}}
""")  # fmt: skip
    engine = ScriptedEngine(tokenizer, {"ok": ["right"], "no": ["wrong"], "boom": ["right"]})
    source = source_for(tokenizer, engine, agent)
    judged = []

    def score(prompts, responses, labels):  # the run's reward function: 1 when the response is the label
        judged.extend(zip(prompts, responses, strict=True))
        values = torch.tensor([float(r == lab) for r, lab in zip(responses, labels, strict=True)])
        return SimpleNamespace(rewards=values, scores=values)

    batch = [{"prompt": p, "label": "right"} for p in ("ok", "no", "boom")]
    try:
        from reinforce_pro.trainer.evaluation import evaluate_agent

        m = evaluate_agent(source, score, batch, "held", 1, temperature=0.6)
    finally:
        source.close()
    assert ("ok", "right") in judged and ("no", "wrong") in judged
    assert m["eval/held/score_mean"] == pytest.approx(1 / 3)  # "boom" said "right" but raised: it scores 0


QWEN3_LIKE = (  # drops the <think> block of every assistant turn but the last, as Qwen3's template does
    "{{ bos_token }}{% for m in messages %}{% set c = m['content'] %}"
    "{% if m['role'] == 'assistant' and not loop.last and '</think>' in c %}{% set c = c.split('</think>')[-1] %}"
    "{% endif %}{{ m['role'] }}: {{ c }}{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def test_a_template_that_rewrites_history_starts_a_new_segment(tokenizer, tmp_path):
    rewriting = copy.deepcopy(tokenizer)
    rewriting.chat_template = QWEN3_LIKE
    engine = ScriptedEngine(rewriting, {"q": ["<think>hmm</think>a"], "more": ["b"]})
    agent = agent_file(tmp_path, CHAT_AGENT)
    source = source_for(rewriting, engine, agent)
    try:
        samples = source.generate([{"prompt": "q", "label": None}], 2)
    finally:
        source.close()
    # each episode: call 1 sampled after "user: q", call 2 after a history whose <think> was dropped -> 2 rows
    assert samples.metrics["agent/segment_forks"] == 2 and samples.metrics["agent/rows"] == 4
    assert samples.fork_of == [0, 1]  # rows 2, 3 (the first segments) share the advantage of rows 0, 1
    assert samples.rewards.rewards.tolist() == [1.0, 1.0, 1.0, 1.0]  # both segments carry the episode's reward
    for row, given in ((0, engine.given[2]), (2, engine.given[0])):  # each row's prompt: what its call was given
        prompt = samples.sequences[row, : -samples.num_actions][
            samples.attention_mask[row, : -samples.num_actions] == 1
        ]
        assert prompt.tolist() == given
    assert "<think>" not in rewriting.decode(engine.given[2])  # the rewritten history the engine was given
    builder = SimpleNamespace(cfg=SimpleNamespace(advantage_estimator="reinforce_baseline",
                              use_kl_loss=True, gamma=1.0, lambd=1.0, std_norm=False, reward_clip_range=None),
                              kl_ctl=SimpleNamespace(value=0.0))  # fmt: skip
    from reinforce_pro.trainer.experience_builder import ExperienceBuilder

    samples.rewards.rewards[:] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    adv, _ = ExperienceBuilder.advantages(builder, samples, samples.rewards.rewards, None, None)
    for fork, lead in ((2, 0), (3, 1)):
        m = samples.action_mask[fork]
        assert adv[fork][m].unique().tolist() == [adv[lead][samples.action_mask[lead]].mean().item()]
        assert (adv[fork][~m] == 0).all()


CHAT_AGENT = """
async def run_agent(client, prompt, label):
    messages = [{"role": "user", "content": prompt}]
    first = await client.chat.completions.create(model="policy", messages=messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "more"}]
    await client.chat.completions.create(model="policy", messages=messages)
    return {"reward": 1.0}
"""

# OpenRLHF's examples/python/agent_func_openai_server_executor.py: its run_agent, unchanged, in a file whose class
# subclasses nothing (OpenRLHF's base class is not installed here; the body is what must run unchanged).
OPENRLHF_EXECUTOR = """
class AgentExecutor:
    async def run_agent(self, prompt: str, label: str, session_id: str):
        await self.client.chat.completions.create(
            model=self.model_name,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=self.sampling_params.max_tokens,
            temperature=self.sampling_params.temperature,
            top_p=self.sampling_params.top_p,
            logprobs=self.sampling_params.logprobs is not None,
            top_logprobs=self.sampling_params.logprobs or 1,
            extra_body={"session_id": session_id},
        )
        return {}
"""


def test_openrlhfs_executor_run_agent_runs_unchanged_and_the_reward_function_scores(tokenizer, tmp_path):
    engine = ScriptedEngine(tokenizer, {"2+2=": ["4"]})
    agent = agent_file(tmp_path, OPENRLHF_EXECUTOR)
    assert agent.kind == "executor"
    source = source_for(tokenizer, engine, agent)
    try:
        samples = source.generate([{"prompt": "2+2=", "label": "4"}], 2)
    finally:
        source.close()
    assert samples.rewards is None  # run_agent returned {}: the run's reward function scores the rows
    assert samples.responses == ["4", "4"] and samples.metrics["agent/rows"] == 2
    assert engine.given[0] == tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": "2+2="}],
                                        tokenize=False, add_generation_prompt=True), add_special_tokens=False)[
        "input_ids"]  # fmt: skip


# ---------------------------------------------------------------------------------------------- hostile clients
@pytest.fixture
def live(tokenizer):
    engine = ScriptedEngine(tokenizer, {"": ["ok"]}, delay_s=0.05)
    endpoint = Endpoint(tokenizer, engine, RUN_SAMPLING, max_len=64, batch_wait_s=0.01)
    endpoint.start()
    yield endpoint, engine
    endpoint.stop()


def post(endpoint, path, timeout=10.0, **kw):
    return httpx.post(endpoint.url + path, timeout=timeout, **kw)


CHAT = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "body, status, code",
    [
        pytest.param(b"{not json", 400, "invalid_json", id="bad-json"),
        pytest.param(b"[1, 2]", 400, "invalid_json", id="not-an-object"),
        pytest.param(b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "invalid_json", id="nested-5000-deep"),
        pytest.param({**CHAT, "max_tokens": -1}, 400, "invalid", id="max-tokens-negative"),
        pytest.param({**CHAT, "temperature": 0.3}, 400, "sampling_pinned", id="another-temperature"),
        pytest.param({**CHAT, "top_p": 0.9}, 400, "sampling_pinned", id="another-top-p"),
        pytest.param({**CHAT, "temperature": "hot"}, 400, "invalid", id="a-temperature-that-is-no-number"),
        pytest.param({**CHAT, "presence_penalty": 1.0}, 400, "unsupported", id="a-penalty"),
        pytest.param({**CHAT, "n": 2}, 400, "unsupported", id="n"),
        pytest.param({**CHAT, "stream": "yes"}, 400, "invalid", id="stream-no-bool"),
        pytest.param({**CHAT, "messages": []}, 400, "invalid", id="no-messages"),
        pytest.param({**CHAT, "messages": [{"content": "x"}]}, 400, "invalid", id="no-role"),
        pytest.param(
            {**CHAT, "messages": [{"role": "user", "content": "x" * 80}]},
            400,
            "context_length_exceeded",
            id="prompt-over-the-episode-limit",
        ),  # fmt: skip
    ],
)
def test_a_bad_request_is_an_openai_error_and_the_endpoint_keeps_serving(live, body, status, code):
    endpoint, _ = live
    sid = endpoint.open_session()
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = post(endpoint, f"/s/{sid}/v1/chat/completions", **kw)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code)
    ok = post(endpoint, f"/s/{sid}/v1/chat/completions", json=CHAT)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "ok"
    assert endpoint.close_session(sid).trajectory.calls == 1  # refused requests record nothing


def test_max_tokens_above_the_runs_is_clamped_to_it_and_counted_and_n_null_is_one(live):
    """Anthropic's clients always send a max_tokens (often 4096 or more): it is clamped to --max_new_tokens, not
    refused, and the clamp is counted (agent/clamped_max_tokens); `n: null` is OpenAI's default, one choice."""
    endpoint, engine = live
    sid = endpoint.open_session()
    r = post(endpoint, f"/s/{sid}/v1/chat/completions", json={**CHAT, "max_tokens": 4096, "n": None})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
    assert post(endpoint, f"/s/{sid}/v1/chat/completions", json={**CHAT, "max_tokens": 5}).status_code == 200
    trajectory = endpoint.close_session(sid).trajectory
    assert (trajectory.calls, trajectory.clamped) == (2, 1)


class FieldEngine(ScriptedEngine):
    """A scripted engine that keeps each call's sampling and, when asked for top_logprobs k, returns each
    position's k likeliest tokens (the sampled one first); its second token's log-prob is NaN, as an engine
    returns for a position it scored none for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampling: list[dict] = []

    def __call__(self, prompt_ids, sampling):
        self.sampling.append(dict(sampling))
        out = super().__call__(prompt_ids, sampling)
        for g in out:
            if len(g.log_probs) > 1:
                g.log_probs[1] = float("nan")
            k = sampling.get("top_logprobs", 0)
            if k:
                g.top_log_probs = [[(t, -0.1), *((40 + j, -2.0 - j) for j in range(k - 1))] for t in g.token_ids]
        return out


@pytest.fixture
def fields(tokenizer):
    engine = FieldEngine(tokenizer, {"": ["ok"]})
    endpoint = Endpoint(tokenizer, engine, RUN_SAMPLING, max_len=64, batch_wait_s=0.01)
    endpoint.start()
    yield endpoint, engine
    endpoint.stop()


@pytest.mark.parametrize(
    "path, extra, param",
    [
        ("chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
        ("chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "response_format"),
        ("chat/completions", {"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ("chat/completions", {"function_call": "auto"}, "function_call"),
        ("chat/completions", {"ignore_eos": True}, "ignore_eos"),
        ("chat/completions", {"min_tokens": 3}, "min_tokens"),
        ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("chat/completions", {"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
        ("chat/completions", {"continue_final_message": True}, "continue_final_message"),
        ("chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
        ("chat/completions", {"seed": -1}, "seed"),
        ("chat/completions", {"stop_token_ids": [10**6]}, "stop_token_ids"),
        ("completions", {"echo": True}, "echo"),
        ("completions", {"best_of": 3}, "best_of"),
        ("completions", {"suffix": "x"}, "suffix"),
        ("completions", {"logprobs": 21}, "logprobs"),
    ],
)  # fmt: skip
def test_a_field_the_trainer_could_not_score_is_refused_by_name(fields, path, extra, param):
    """What would change the sampled distribution out of the trainer's sight (guided decoding, ignore_eos, another
    minimum length) or ask for a shape not served is a 400 naming the field, and records nothing."""
    endpoint, engine = fields
    sid = endpoint.open_session()
    body = {"prompt": "hi"} if path == "completions" else dict(CHAT)
    r = post(endpoint, f"/s/{sid}/v1/{path}", json={**body, **extra})
    assert (r.status_code, r.json()["error"]["param"]) == (400, param), r.text
    assert engine.sampling == [] and endpoint.close_session(sid).trajectory.calls == 0


def test_fields_that_change_nothing_the_trainer_scores_are_honoured(fields, tokenizer):
    """seed and stop_token_ids reach the engine; the developer role is the system role; neutral values of refused
    fields pass; chat_template_kwargs reach the template; continue_final_message continues the last message."""
    endpoint, engine = fields
    sid = endpoint.open_session()
    neutral = {"response_format": {"type": "text"}, "functions": [], "min_tokens": 0, "n": None, "seed": 7,
               "stop_token_ids": [5], "user": "u", "metadata": {"k": "v"}, "store": False,
               "messages": [{"role": "developer", "content": "D"}, {"role": "user", "content": "hi"}]}  # fmt: skip
    assert post(endpoint, f"/s/{sid}/v1/chat/completions", json={**CHAT, **neutral}).status_code == 200
    assert engine.sampling[-1]["seed"] == 7 and engine.sampling[-1]["stop_token_ids"] == [5]
    assert "system: D\nuser: hi\n" in tokenizer.decode(engine.given[-1])
    cont = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "o"}],
            "continue_final_message": True}  # fmt: skip
    assert post(endpoint, f"/s/{sid}/v1/chat/completions", json={**CHAT, **cont}).status_code == 200
    assert tokenizer.decode(engine.given[-1], skip_special_tokens=False).endswith("user: hi\nassistant: o")
    endpoint.close_session(sid)
    thinking = copy.deepcopy(tokenizer)
    from reinforce_pro.models.tiny import CHAT_TEMPLATE

    thinking.chat_template = CHAT_TEMPLATE + "{% if enable_thinking is defined and not enable_thinking %}/no{% endif %}"
    endpoint.tokenizer = thinking
    sid = endpoint.open_session()
    body = {**CHAT, "chat_template_kwargs": {"enable_thinking": False}}
    assert post(endpoint, f"/s/{sid}/v1/chat/completions", json=body).status_code == 200
    assert tokenizer.decode(engine.given[-1]).endswith("assistant: /no")
    endpoint.close_session(sid)


def test_log_probs_come_back_in_each_routes_shape_with_the_likeliest_tokens_asked_for(fields, tokenizer):
    """Chat: content entries with top_logprobs (OpenRLHF's executor asks for 1); completions: the legacy tokens /
    token_logprobs / top_logprobs / text_offset, where an integer logprobs 0 is the sampled token's alone (it was
    taken for off). A NaN the engine returned is null, not a 500."""
    endpoint, engine = fields
    sid = endpoint.open_session()
    chat = post(endpoint, f"/s/{sid}/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 2})
    assert chat.status_code == 200 and engine.sampling[-1]["top_logprobs"] == 2
    content = chat.json()["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == ["o", "k", "<eos>"] and [e["logprob"] for e in content][:2] == [-0.0, None]
    assert [[t["logprob"] for t in e["top_logprobs"]] for e in content] == [[-0.1, -2.0]] * 3
    plain = post(endpoint, f"/s/{sid}/v1/completions", json={"prompt": "hi", "logprobs": 0})
    legacy = plain.json()["choices"][0]["logprobs"]
    assert "top_logprobs" not in engine.sampling[-1] and legacy["tokens"] == ["o", "k", "<eos>"]
    assert legacy["token_logprobs"][1] is None and legacy["text_offset"] == [0, 1, 2] and legacy["top_logprobs"] is None
    top = post(endpoint, f"/s/{sid}/v1/completions", json={"prompt": "hi", "logprobs": 2}).json()["choices"][0]
    assert engine.sampling[-1]["top_logprobs"] == 2 and top["logprobs"]["top_logprobs"][0] == {
        "o": -0.1,
        tokenizer.decode([40]): -2.0,
    }
    assert post(endpoint, f"/s/{sid}/v1/completions", json={"prompt": "hi"}).json()["choices"][0]["logprobs"] is None
    endpoint.close_session(sid)


def test_sessions_unknown_ended_missing_and_oversized_bodies(live):
    endpoint, _ = live
    assert post(endpoint, "/s/nope/v1/chat/completions", json=CHAT).status_code == 404
    assert post(endpoint, "/v1/chat/completions", json=CHAT).json()["error"]["code"] == "session_missing"
    sid = endpoint.open_session()
    assert post(endpoint, "/v1/chat/completions", json=CHAT, headers={"X-Session-Id": sid}).status_code == 200
    assert post(endpoint, "/v1/chat/completions", json={**CHAT, "session_id": sid}).status_code == 200
    endpoint.close_session(sid)
    assert post(endpoint, f"/s/{sid}/v1/chat/completions", json=CHAT).status_code == 410
    big = {**CHAT, "junk": "x" * MAX_BODY_BYTES}
    sid = endpoint.open_session()
    assert post(endpoint, f"/s/{sid}/v1/chat/completions", json=big).status_code == 413
    assert httpx.get(endpoint.url + "/health").json()["status"] == "ok"
    models = httpx.get(f"{endpoint.url}/s/{sid}/v1/models").json()
    assert models["data"][0]["id"] == "policy"


def test_many_concurrent_sessions_are_batched_and_all_answered(live):
    endpoint, engine = live
    sessions = [endpoint.open_session() for _ in range(200)]
    endpoint.set_live(len(sessions))

    async def main():
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=300), timeout=30) as http:
            clients = [openai.AsyncOpenAI(base_url=f"{endpoint.url}/s/{s}/v1", api_key="x", http_client=http)
                       for s in sessions]  # fmt: skip
            return await asyncio.gather(*(c.chat.completions.create(**CHAT) for c in clients))

    replies = asyncio.run(main())
    assert [r.choices[0].message.content for r in replies] == ["ok"] * 200
    assert sum(engine.calls) == 200 and len(engine.calls) <= 5  # batched, not 200 engine calls
    assert all(endpoint.close_session(s).trajectory.calls == 1 for s in sessions)


def test_sessions_near_the_length_limit_are_sampled_in_one_call_each_cut_to_its_room(tokenizer):
    """Near --max_len every session has its own room, and a batching key holding each one's max_tokens split the
    batch into one engine call a session; now one call, with each completion cut to its own room (a longer
    sample's first tokens are a sample of that many), ending for "length"."""
    engine = ScriptedEngine(tokenizer, {"": ["abcdefghij"]})
    endpoint = Endpoint(tokenizer, engine, RUN_SAMPLING, max_len=64, batch_wait_s=0.5)
    endpoint.start()
    try:
        sessions = [endpoint.open_session() for _ in range(8)]
        endpoint.set_live(len(sessions))

        async def main():
            async with httpx.AsyncClient(timeout=30) as http:
                return await asyncio.gather(*(http.post(
                    f"{endpoint.url}/s/{sid}/v1/chat/completions", json={**CHAT, "messages": [
                        {"role": "user", "content": "q" * (30 + i)}]}) for i, sid in enumerate(sessions)))  # fmt: skip

        replies = [r.json() for r in asyncio.run(main())]
        assert engine.calls == [8]  # one engine call (it was 8)
        rooms = [64 - r["usage"]["prompt_tokens"] for r in replies]  # 15 down to 8; the reply is 11 tokens
        assert len(set(rooms)) == 8 and all(r["usage"]["completion_tokens"] == min(room, 11) for r, room in
                                             zip(replies, rooms, strict=True))  # fmt: skip
        assert all(r["choices"][0]["finish_reason"] == "length" for r, room in zip(replies, rooms, strict=True)
                   if room < 11)  # fmt: skip
        for sid in sessions:
            (call,) = endpoint.close_session(sid).trajectory.segments[0]
            assert len(call.log_probs) == len(call.completion_ids) <= 64 - len(call.prompt_ids)
    finally:
        endpoint.stop()


def test_a_request_whose_episode_ended_while_it_waited_never_reaches_the_engine(tokenizer):
    """The step ends (its sessions closed) while a request waits for its batch: it is answered 410 and no engine
    call is made for it (a flush after the step ran it on the engines, under partial rollouts inside the next
    step); the ended sessions kept for that 410 are bounded."""
    engine = ScriptedEngine(tokenizer, {"": ["ok"]})
    endpoint = Endpoint(tokenizer, engine, RUN_SAMPLING, max_len=64, batch_wait_s=30)
    endpoint.start()
    try:
        sid = endpoint.open_session()
        endpoint.set_live(2)  # another agent still runs: the batch waits for it
        reply = {}
        waiting = threading.Thread(target=lambda: reply.update(r=post(endpoint, f"/s/{sid}/v1/chat/completions",
                                                                         json=CHAT, timeout=30)))  # fmt: skip
        waiting.start()
        deadline = time.monotonic() + 10
        while not endpoint.batcher.pending:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        endpoint.close_session(sid)  # the step ends
        endpoint.set_live(0)
        waiting.join(timeout=10)
        assert reply["r"].status_code == 410 and engine.calls == []
    finally:
        endpoint.stop()
    from reinforce_pro.agents import openai_endpoint

    bounded = Endpoint(tokenizer, engine, RUN_SAMPLING, max_len=64)
    kept, openai_endpoint.ENDED_KEPT = openai_endpoint.ENDED_KEPT, 3
    try:
        for _ in range(10):
            bounded.close_session(bounded.open_session())
    finally:
        openai_endpoint.ENDED_KEPT = kept
    assert len(bounded.ended) == 3


def test_with_several_engines_each_session_stays_on_one_and_they_run_at_once(tokenizer):
    """Sessions are pinned round robin: every turn of an episode goes to the engine its first did (its prefix
    cache), and the engines' calls of one batch overlap."""
    seen, lock = [], threading.Lock()
    base = ScriptedEngine(tokenizer, {"": ["ok"]})

    def sample(prompts, sampling, engines=None):
        with lock:
            seen.append((engines[0], len(prompts), time.perf_counter()))
        time.sleep(0.2)
        return base(prompts, sampling)

    endpoint = Endpoint(tokenizer, sample, RUN_SAMPLING, max_len=64, engines=["e0", "e1"])
    endpoint.start()
    try:
        sessions = [endpoint.open_session() for _ in range(4)]
        endpoint.set_live(4)

        async def episode(sid):
            c = openai.AsyncOpenAI(base_url=f"{endpoint.url}/s/{sid}/v1", api_key="x", max_retries=0)
            for _ in range(2):
                await c.completions.create(model="p", prompt="hi")

        async def main():
            await asyncio.gather(*(episode(s) for s in sessions))

        asyncio.run(main())
    finally:
        endpoint.stop()
    assert [endpoint.close_session(s).engine for s in sessions] == [0, 1, 0, 1]
    assert sorted((e, n) for e, n, _ in seen) == [("e0", 2), ("e0", 2), ("e1", 2), ("e1", 2)]
    first = sorted(t for _, _, t in seen)[:2]
    assert first[1] - first[0] < 0.15  # the two engines' first calls overlapped (each takes 0.2 s)


def test_a_client_that_disconnects_mid_generation_leaves_the_endpoint_serving(live):
    endpoint, engine = live
    engine.delay_s = 0.5
    sid = endpoint.open_session()
    with pytest.raises(httpx.ReadTimeout):
        post(endpoint, f"/s/{sid}/v1/chat/completions", json=CHAT, timeout=0.1)
    engine.delay_s = 0.0
    session = endpoint.sessions[sid]
    deadline = time.monotonic() + 5
    while session.trajectory.abandoned == 0 and time.monotonic() < deadline:  # the engine call ends after 0.5 s
        time.sleep(0.05)
    # the generation the client never received is not in its trajectory: a retry starts the episode, no fork
    assert session.trajectory.abandoned == 1 and session.trajectory.calls == 0
    assert post(endpoint, f"/s/{sid}/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
    assert session.trajectory.calls == 1 and session.trajectory.forks == 0


def test_idle_connections_do_not_take_the_endpoint(live):
    import socket

    endpoint, _ = live
    port = int(endpoint.url.rsplit(":", 1)[1])
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(300)]  # connect, send nothing
    try:
        sid = endpoint.open_session()
        assert post(endpoint, f"/s/{sid}/v1/chat/completions", json=CHAT, timeout=5).status_code == 200
    finally:
        for s in idle:
            s.close()


def test_a_stop_string_cuts_the_text_not_the_ids(live):
    endpoint, engine = live
    engine.replies = {"": ["ab;cd"]}
    sid = endpoint.open_session()
    r = post(endpoint, f"/s/{sid}/v1/completions", json={"model": "p", "prompt": "x", "stop": [";"]}).json()
    assert r["choices"][0]["text"] == "ab"  # what the client is shown
    assert r["token_ids"]["completion_token_ids"] == engine.sampled[-1].token_ids  # what the engine sampled
    nxt = post(endpoint, f"/s/{sid}/v1/completions", json={"model": "p", "prompt": "xab then"}).json()
    assert nxt["token_ids"]["prompt_token_ids"][: len(engine.given[0]) + len(engine.sampled[0].token_ids)] == (
        engine.given[0] + engine.sampled[0].token_ids
    )  # the next turn continues the engine's ids, stop string and <eos> included
    assert endpoint.close_session(sid).trajectory.forks == 0


@pytest.mark.parametrize(
    "body, failure",
    [
        pytest.param(
            "async def run_agent(client, prompt, label):\n    raise RuntimeError('tool down')\n",
            "raised RuntimeError: tool down",
            id="raises",
        ),  # fmt: skip
        pytest.param(
            "async def run_agent(client, prompt, label):\n    return {'reward': 1.0}\n",
            "never called the endpoint",
            id="never-calls",
        ),  # fmt: skip
        pytest.param(
            CHAT_AGENT.replace('return {"reward": 1.0}', "return 'done'"), "must return a dict", id="returns-junk"
        ),  # fmt: skip
    ],
)
def test_an_agent_that_fails_everywhere_stops_with_its_error(tokenizer, tmp_path, body, failure):
    source = source_for(tokenizer, ScriptedEngine(tokenizer, {"": ["x"]}), agent_file(tmp_path, body))
    try:
        with pytest.raises(AgentFileError, match=failure):
            source.generate([{"prompt": "q", "label": None}], 2)
    finally:
        source.close()


def test_a_failing_episode_drops_its_group_and_is_counted(tokenizer, tmp_path, capsys):
    body = CHAT_AGENT.replace(
        "    messages = [", "    if prompt == 'bad':\n        raise ValueError('x')\n    messages = ["
    )
    source = source_for(tokenizer, ScriptedEngine(tokenizer, {"": ["x"]}), agent_file(tmp_path, body))
    try:
        samples = source.generate([{"prompt": "good", "label": None}, {"prompt": "bad", "label": None}], 2)
    finally:
        source.close()
    assert samples.metrics["agent/dropped_episodes"] == 2 and samples.metrics["agent/rows"] == 2
    assert samples.prompts == ["good", "good"] and "raised ValueError" in capsys.readouterr().err


def test_agent_file_shapes_are_told_apart_and_bad_ones_refused(tmp_path):
    assert load_agent(EXAMPLES / "agent_calculator_openai.py").kind == "function"
    assert isinstance(load_agent(EXAMPLES / "agent_calculator.py"), type)  # AgentInstance stays as it is
    for body, message in (
        ("def run_agent(client, prompt, label):\n    return {}\n", "must be an async function"),
        ("async def run_agent(client):\n    return {}\n", "takes \\(client, prompt, label\\)"),
        ("x = 1\n", "defines none of"),
        ('CLIENT = "claude"\nasync def run_agent(client, prompt, label):\n    return {}\n', "CLIENT must be one of"),
    ):
        path = tmp_path / "a.py"
        path.write_text(body)
        with pytest.raises(AgentFileError, match=message):
            load_agent(path)


def test_the_endpoint_listens_on_loopback_only_and_stops(tokenizer):
    endpoint = Endpoint(tokenizer, ScriptedEngine(tokenizer, {"": ["x"]}), RUN_SAMPLING, max_len=64)
    url = endpoint.start()
    assert url.startswith("http://127.0.0.1:")
    assert endpoint.serving
    endpoint.stop()
    assert not endpoint.serving
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=2)


def test_an_engine_lost_under_the_episodes_is_raised_for_the_recovery_once_they_end(tokenizer):
    """The engine dies at the step's first call: its requests are answered 503 and the agents fail, and then the
    source raises the engine's error (not the agent's) so the trainer's engine recovery replaces the engine and
    samples the batch again; the next call, on a working engine, trains as usual."""
    from ray import exceptions as rex

    from reinforce_pro.trainer.engine_recovery import EngineRecovery

    engine = ScriptedEngine(tokenizer, {"3+4=": ["7"]})
    calls = []

    def dying_once(prompt_ids, sampling):
        calls.append(len(prompt_ids))
        if len(calls) == 1:
            raise rex.ActorDiedError()
        return engine(prompt_ids, sampling)

    source = source_for(tokenizer, dying_once, load_agent(EXAMPLES / "agent_calculator_openai.py"))
    replaced = []
    recovery = EngineRecovery([], weight_sync=None, restart=None)  # the trainer's; replacing is the driver's part
    recovery.replace = lambda error, step: replaced.append(type(error).__name__)  # which error reached it
    try:
        samples = recovery.run(lambda: source.generate([{"prompt": "3+4=", "label": "7"}], 2), step=0)
    finally:
        source.close()
    assert replaced == ["ActorDiedError"] and calls == [2, 2]  # both episodes' first turns, then again
    assert samples.rewards.rewards.tolist() == [1.0, 1.0] and samples.metrics["agent/dropped_episodes"] == 0


def test_an_endpoint_that_stopped_answering_is_started_again_before_the_next_episodes(tokenizer, capsys):
    engine = ScriptedEngine(tokenizer, {"3+4=": ["7"]})
    source = source_for(tokenizer, engine, load_agent(EXAMPLES / "agent_calculator_openai.py"))
    try:
        url, restarts = source.endpoint.url, service_restarts()
        first = source.generate([{"prompt": "3+4=", "label": "7"}], 1)
        source.endpoint._server.server.stop()  # its server thread ends, as a crashed service's would
        assert not source.endpoint.serving
        again = source.generate([{"prompt": "3+4=", "label": "7"}], 1)  # the step checks it first
        assert source.endpoint.serving and source.endpoint.url == url  # the agents' clients keep their URL
        assert service_restarts() == restarts + 1
        source.generate([{"prompt": "3+4=", "label": "7"}], 1)
        assert service_restarts() == restarts + 1  # answering: left alone
    finally:
        source.close()
    assert again.rewards.rewards.tolist() == first.rewards.rewards.tolist() == [1.0]
    assert again.metrics["agent/dropped_episodes"] == 0
    err = capsys.readouterr().err
    assert f"[openai-endpoint] stopped answering at {url} (its server thread ended); started again" in err


# ---------------------------------------------------------------------------------------------- Anthropic's SDK
MESSAGES = {"model": "policy", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
BAD = "invalid_request_error"


def test_the_anthropic_sdk_gets_messages_and_its_turns_extend_one_sequence(live, tokenizer):
    """Anthropic's Messages API on the same endpoint: `system` and text blocks go through the chat template, the
    reply is a Message with the engine's ids, a next turn extends the first (one segment), and a last message
    from the assistant is continued (prefill), not answered."""
    anthropic = pytest.importorskip("anthropic")
    endpoint, engine = live
    sid = endpoint.open_session()
    client = anthropic.Anthropic(base_url=f"{endpoint.url}/s/{sid}", api_key="none", max_retries=0)
    first = client.messages.create(
        model="policy",
        max_tokens=5,
        system="S",
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    )
    assert (first.type, first.role, first.content[0].text, first.stop_reason) == (
        "message",
        "assistant",
        "ok",
        "end_turn",
    )
    want = tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert engine.given[-1] == tokenizer(want, add_special_tokens=False)["input_ids"]
    assert first.usage.input_tokens == len(engine.given[-1])
    assert first.usage.output_tokens == len(engine.sampled[-1].token_ids)
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "go"},
    ]
    client.messages.create(model="policy", max_tokens=5, system="S", messages=turns)
    prefill = [*turns, {"role": "assistant", "content": "o"}]
    client.messages.create(model="policy", max_tokens=5, system="S", messages=prefill)
    continued = tokenizer.decode(engine.given[-1], skip_special_tokens=False)
    assert continued.endswith("user: go\nassistant: o") and tokenizer.eos_token not in continued.split("go")[-1]
    trajectory = endpoint.close_session(sid).trajectory
    assert trajectory.calls == 3 and len(trajectory.segments) == 2  # the prefill re-renders the last turn


@pytest.mark.parametrize(
    "body, status, kind",
    [
        pytest.param({"model": "policy", "messages": MESSAGES["messages"]}, 400, BAD, id="no-max"),
        pytest.param({**MESSAGES, "max_tokens": 0}, 400, BAD, id="max-zero"),
        pytest.param({**MESSAGES, "tools": [{"type": "web_search_20250305", "name": "s"}]}, 400, BAD, id="server-tool"),
        pytest.param({**MESSAGES, "thinking": {"type": "enabled", "budget_tokens": 4}}, 400, BAD, id="thinking"),
        pytest.param({**MESSAGES, "messages": [{"role": "tool", "content": ""}]}, 400, BAD, id="tool"),
        pytest.param(
            {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400, BAD, id="image",
        ),
    ],
)  # fmt: skip
def test_a_bad_messages_request_is_an_anthropic_error(live, body, status, kind):
    endpoint, _ = live
    sid = endpoint.open_session()
    r = post(endpoint, f"/s/{sid}/v1/messages", json=body)
    assert r.status_code == status and r.json()["type"] == "error" and r.json()["error"]["type"] == kind
    assert post(endpoint, f"/s/{sid}/v1/messages", json=MESSAGES).json()["content"][0]["text"] == "ok"
    assert endpoint.close_session(sid).trajectory.calls == 1


def test_the_anthropic_sdk_raises_its_own_errors(live):
    anthropic = pytest.importorskip("anthropic")
    endpoint, _ = live
    with pytest.raises(anthropic.NotFoundError, match="unknown session"):
        anthropic.Anthropic(base_url=f"{endpoint.url}/s/nope", api_key="none", max_retries=0).messages.create(
            **MESSAGES
        )
    sid = endpoint.open_session()
    client = anthropic.Anthropic(base_url=f"{endpoint.url}/s/{sid}", api_key="none", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="differs from the run's"):
        client.messages.create(**MESSAGES, extra_body={"temperature": 0.3})  # the SDK has no such argument
    stopped = client.messages.create(**{**MESSAGES, "max_tokens": 12}, stop_sequences=["k"])
    assert (stopped.content[0].text, stopped.stop_reason, stopped.stop_sequence) == ("o", "stop_sequence", "k")
    from reinforce_pro.agents.openai_app import message_response
    from reinforce_pro.agents.tools import Parsed
    from reinforce_pro.agents.trajectory import Call

    cut = Call([1], [5, 6], [-0.1, -0.2], "length", "ab", None)  # the engine stopped at max_tokens
    assert message_response(MESSAGES, [], cut, endpoint.tokenizer, Parsed("ab", []))["stop_reason"] == "max_tokens"


def test_an_agent_file_that_asks_for_the_anthropic_client_trains_on_its_ids(tokenizer, tmp_path):
    """CLIENT = "anthropic": run_agent gets an anthropic.AsyncAnthropic on its session; the row is the engine's
    ids of the templated prompt and the reply, scored by the agent's reward."""
    pytest.importorskip("anthropic")
    agent = agent_file(tmp_path, ANTHROPIC_AGENT)
    assert agent.client == "anthropic"
    engine = ScriptedEngine(tokenizer, {"3+4=": ["7"]})
    source = source_for(tokenizer, engine, agent)
    try:
        samples = source.generate([{"prompt": "3+4=", "label": "7"}], 1)
    finally:
        source.close()
    assert samples.rewards.rewards.tolist() == [1.0]
    (given,), (sampled,) = engine.given, engine.sampled
    assert prompt_of(samples, 0) == given
    assert samples.sequences[0, -samples.num_actions :][: len(sampled.token_ids)].tolist() == sampled.token_ids


ANTHROPIC_AGENT = """
CLIENT = "anthropic"

async def run_agent(client, prompt, label):
    reply = await client.messages.create(model="policy", max_tokens=8, messages=[{"role": "user", "content": prompt}])
    return {"reward": float(reply.content[0].text.strip() == label), "scores": 0.0, "extra_logs": {}}
"""


def test_streamed_requests_get_the_sampled_text_and_record_the_call_once(live):
    """stream=True through both SDKs: the OpenAI chat and completion streams and Anthropic's event stream carry
    the sampled text (in one delta: the engines sample whole completions), the finish reason and the usage; each
    call is recorded once, with the same ids as unstreamed."""
    import openai

    anthropic = pytest.importorskip("anthropic")
    endpoint, engine = live
    sid = endpoint.open_session()
    client = openai.OpenAI(base_url=f"{endpoint.url}/s/{sid}/v1", api_key="none", max_retries=0)
    chunks = list(client.chat.completions.create(model="policy", messages=CHAT["messages"], stream=True,
                                                 stream_options={"include_usage": True}))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok"
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, "stop"]
    assert chunks[-1].usage.completion_tokens == len(engine.sampled[-1].token_ids)
    pieces = list(client.completions.create(model="policy", prompt="2+2=", stream=True))
    assert "".join(p.choices[0].text for p in pieces) == "ok" and pieces[-1].choices[0].finish_reason == "stop"
    claude = anthropic.Anthropic(base_url=f"{endpoint.url}/s/{sid}", api_key="none", max_retries=0)
    with claude.messages.stream(**MESSAGES) as stream:
        text, final = "".join(stream.text_stream), stream.get_final_message()
    assert (
        text == "ok"
        and final.stop_reason == "end_turn"
        and final.usage.output_tokens == len(engine.sampled[-1].token_ids)
    )
    trajectory = endpoint.close_session(sid).trajectory
    assert trajectory.calls == 3
    assert [c.completion_ids for s in trajectory.segments for c in s] == [g.token_ids for g in engine.sampled[-3:]]


# ------------------------------------------------------------------------------- self-play's solver (--absolute_zero)
SOLVER_AGENT = """
async def run_agent(client, prompt, label):
    if label == "9":
        raise RuntimeError("no tool today")
    first = await client.completions.create(model="policy", prompt=prompt)
    if label == "5":  # a summarised history: the second prompt does not extend the first call's sequence
        await client.completions.create(model="policy", prompt="again " + prompt)
    return {"reward": 123.0}  # not read: the task scores the answer
"""


def test_an_sdk_solver_answers_self_play_questions_with_the_ids_it_sampled(tokenizer, tmp_path, capsys):
    """--absolute_zero --agent_func_path: selfplay/solve.py runs the agent per question; the rollout's text is its
    last model turn, its row the engine's ids; a rewritten history adds the earlier segment as a fork; an agent
    that raised before calling gives a row with nothing to train, scored as an empty answer and counted."""
    from reinforce_pro.selfplay.builtin_tasks import ArithmeticTask
    from reinforce_pro.selfplay.solve import solve
    from reinforce_pro.selfplay.tasks import Question

    engine = ScriptedEngine(tokenizer, {"1+1=": ["2"], "2+3=": ["4"], "again": ["5"]})
    source = source_for(tokenizer, engine, agent_file(tmp_path, SOLVER_AGENT), solver_only=True)
    assert source.endpoint is None  # a solver never serves the run's own endpoint
    questions = [Question("1+1", "2"), Question("2+3", "5"), Question("4+5", "9")]
    try:
        rollouts = solve(source.sampler, ArithmeticTask(), questions, RUN_SAMPLING, 128, sdk_agent=source)
        assert len(source.solver_endpoints) == 1  # one endpoint per sampling, started at the first answer
    finally:
        source.close()
    assert [r.text for r in rollouts] == ["2", "5", ""]
    assert [len(r.forks) for r in rollouts] == [0, 1, 0]
    given = [tokenizer.decode(g, skip_special_tokens=True) for g in engine.given]
    by_prompt = dict(zip(given, engine.sampled, strict=True))
    for rows, prompt in (([rollouts[0].generation], "1+1="), (rollouts[1].forks, "2+3="),
                         ([rollouts[1].generation], "again 2+3=")):  # fmt: skip
        (row,) = rows
        assert row.tokens == by_prompt[prompt].token_ids and row.log_probs == by_prompt[prompt].log_probs
        assert row.action == [True] * len(row.tokens)
    empty = rollouts[2].generation
    assert empty.tokens == [] and empty.prompt_ids == tokenizer("4+5=")["input_ids"]
    assert source.failed_answers == 1 and "raised RuntimeError: no tool today" in capsys.readouterr().err


def test_self_play_trains_a_solvers_forked_segments_with_its_advantage(tokenizer, tmp_path):
    """SelfPlaySource.generate puts fork rows after the controller's rows: fork_of names their lead, they carry
    its reward and take its advantage; the step reports the forks and the failed episodes."""
    from reinforce_pro.selfplay.builtin_tasks import ArithmeticTask
    from reinforce_pro.selfplay.controller import Rollout, SelfPlayBatch, SelfPlayConfig, TrainingSample
    from reinforce_pro.selfplay.selfplay_source import SelfPlaySource
    from reinforce_pro.selfplay.solve import solve
    from reinforce_pro.selfplay.tasks import Question
    from reinforce_pro.trainer.experience_builder import ExperienceBuilder

    engine = ScriptedEngine(tokenizer, {"1+1=": ["2"], "2+3=": ["4"], "again": ["5"], "[": ["1+1"]})
    agent = source_for(tokenizer, engine, agent_file(tmp_path, SOLVER_AGENT), solver_only=True)
    cfg = SelfPlayConfig(n_questions_per_prompt=1, weights={"completion": 1.0})
    source = SelfPlaySource(agent.sampler, ArithmeticTask(), cfg, seed=0, sdk_agent=agent)
    try:
        solved = solve(agent.sampler, ArithmeticTask(), [Question("1+1", "2"), Question("2+3", "5")], RUN_SAMPLING,
                       128, sdk_agent=agent)  # fmt: skip
    finally:
        source.close()
    proposal = Rollout("[1+0]>", "1+1", None)
    ids = tokenizer("1+1", add_special_tokens=False)["input_ids"]
    proposal.generation = ([1, 2], Generation(ids, [0.0] * len(ids), "stop"))
    rows = [TrainingSample(solved[0], 1.0, 1.0, "solver"), TrainingSample(solved[1], 0.0, 0.0, "solver"),
            TrainingSample(proposal, 0.5, 0.5, "proposer"), TrainingSample(proposal, 0.0, 0.0, "proposer")]  # fmt: skip
    source.controller.step = lambda batch, n, rng: SelfPlayBatch(rows, [(0, 2, 2), (2, 4, 2)], {})
    samples = source.generate([{"input": "1+0="}], 2)
    assert samples.fork_of == [1] and len(samples.rewards.rewards) == 5
    assert samples.rewards.rewards.tolist() == [1.0, 0.0, 0.5, 0.0, 0.0]  # the fork carries its lead's reward
    assert samples.metrics["agent/segment_forks"] == 1.0 and samples.metrics["agent/failed_episodes"] == 0.0
    assert samples.metrics["agent/episodes"] == 2.0 and agent.answered == 0  # the two answered, then reset
    fork = solved[1].forks[0]
    assert samples.sequences[4, -samples.num_actions :][: len(fork.tokens)].tolist() == fork.tokens
    builder = SimpleNamespace(cfg=SimpleNamespace(advantage_estimator="reinforce_baseline",
                              use_kl_loss=True, gamma=1.0, lambd=1.0, std_norm=False, reward_clip_range=None),
                              kl_ctl=SimpleNamespace(value=0.0))  # fmt: skip
    adv, _ = ExperienceBuilder.advantages(builder, samples, samples.rewards.rewards, None, None)
    lead = adv[1][samples.action_mask[1]]
    assert lead.lt(0).all() and adv[4][samples.action_mask[4]].unique().tolist() == [lead.mean().item()]


def test_self_play_takes_an_sdk_solver_file_and_refuses_an_agentinstance_one(tmp_path):
    """The flags accept --absolute_zero with --agent_func_path; the run's set-up refuses an AgentInstance file
    (a task's AgentInstance solver is its own solver_agent) before it builds anything."""
    from reinforce_pro.cli.flags_to_config import run_config
    from reinforce_pro.cli.train_ppo_ray import parse_args
    from reinforce_pro.run.prepare import UserInputError, prepare

    flags = ["--absolute_zero", "--save_path", str(tmp_path / "run"), "--agent_func_path"]
    with pytest.raises(UserInputError, match="the solver must be an OpenAI-SDK agent"):
        prepare(run_config(parse_args([*flags, str(EXAMPLES / "agent_calculator.py")])))
    assert not (tmp_path / "run").exists()
    cfg = run_config(parse_args([*flags, str(EXAMPLES / "agent_calculator_openai.py")]))
    assert cfg.selfplay is not None and cfg.agent.func_path.endswith("agent_calculator_openai.py")


def test_a_refused_search_self_play_solver_leaves_no_retrieval_service(tmp_path, monkeypatch):
    """Search self-play starts its retrieval service for the agent file to read (SEARCH_RETRIEVER_URL) before the
    file is loaded; when the file is refused, the service is stopped and the variable taken back."""
    from reinforce_pro.cli.flags_to_config import run_config
    from reinforce_pro.cli.train_ppo_ray import parse_args
    from reinforce_pro.run.prepare import UserInputError, prepare
    from reinforce_pro.selfplay.search_task import SearchTask

    monkeypatch.delenv("SEARCH_RETRIEVER_URL", raising=False)
    started = []
    url_of = SearchTask.retriever_url
    monkeypatch.setattr(SearchTask, "retriever_url", lambda self: started.append(self) or url_of(self))
    flags = ["--absolute_zero", "--selfplay_task", "search", "--save_path", str(tmp_path / "run")]
    with pytest.raises(UserInputError, match="the solver must be an OpenAI-SDK agent"):
        prepare(run_config(parse_args([*flags, "--agent_func_path", str(EXAMPLES / "agent_search.py")])))
    (task,) = started
    assert task._server is None and "SEARCH_RETRIEVER_URL" not in os.environ
