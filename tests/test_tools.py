"""Tool calling on the endpoint (agents/tools.py, agents/openai_app.py, agents/responses_api.py): tools rendered
into the prompt, tool calls parsed out of the sampled text, a conversation's tool turns rendered so that the next
request extends the sampled ids; on the Chat Completions, Anthropic Messages and Responses routes, with the real
SDKs against the live loopback endpoint and a scripted engine (its ids known). The agent frameworks' own loops
(LangGraph, the OpenAI Agents SDK) are in tests/test_agent_frameworks.py."""

from __future__ import annotations

import copy
import json
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from reinforce_pro.agents.openai_app import MAX_BODY_BYTES  # noqa: E402
from reinforce_pro.agents.openai_endpoint import Endpoint  # noqa: E402
from reinforce_pro.agents.tools import ToolRequest, parse_completion, render_chat, tool_request  # noqa: E402
from tests.test_openai_agents import RUN_SAMPLING, ScriptedEngine  # noqa: E402

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },  # fmt: skip
    },
}
# compact JSON, as a model may write it (the template's tojson would space it): the history must be the sampled text
CALL = '<tool_call>{"name":"add","arguments":{"a":3,"b":4}}</tool_call>'
# SmolLM2-135M-Instruct's chat template: chatml that knows nothing of tools
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n'"
    " }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    from reinforce_pro.models.tiny import build_tokenizer

    return build_tokenizer()


class RecordingEngine(ScriptedEngine):
    """A scripted engine that also keeps each call's stop strings."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stops: list = []

    def __call__(self, prompt_ids, sampling):
        self.stops.append(sampling.get("stop"))
        return super().__call__(prompt_ids, sampling)


def serve(tokenizer, replies: dict, max_len: int = 512, max_new: int = 96):
    engine = RecordingEngine(tokenizer, replies)
    endpoint = Endpoint(tokenizer, engine, {**RUN_SAMPLING, "max_tokens": max_new}, max_len=max_len,
                        batch_wait_s=0.01)  # fmt: skip
    endpoint.start()
    return endpoint, engine


@pytest.fixture
def live(tokenizer):
    endpoint, engine = serve(tokenizer, {"3+4=": [CALL, "7"], "": ["ok"]})
    yield endpoint, engine
    endpoint.stop()


def add(a: int, b: int) -> int:
    return a + b


# ---------------------------------------------------------------------------------------------- parsing
def test_calls_are_read_out_of_the_text_and_a_call_that_does_not_parse_stays_text():
    tools = ToolRequest([ADD])
    two = parse_completion(f"sum: {CALL}\n<tool_call>\n" + '{"name": "add", "arguments": "{\\"a\\": 1}"}\n</tool_call>',
                           tools)  # fmt: skip
    assert two.content == "sum:" and not two.failed
    assert [json.loads(c["function"]["arguments"]) for c in two.calls] == [{"a": 3, "b": 4}, {"a": 1}]
    assert two.calls[0]["id"] != two.calls[1]["id"] and all(c["id"].startswith("call_") for c in two.calls)
    for bad in ('<tool_call>{"name": "add", "arguments": {"a": </tool_call>',  # malformed JSON
                '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # a tool not declared
                '<tool_call>{"arguments": {}}</tool_call>',  # no name
                f"{CALL}<tool_call>" + '{"name": "add"',  # a second call never closed
                '<tool_call>["add"]</tool_call>'):  # fmt: skip
        parsed = parse_completion(bad, tools)
        assert (parsed.content, parsed.calls, parsed.failed) == (bad, [], True), bad
    assert parse_completion(CALL, ToolRequest([ADD], choice="none")).calls == []  # tool_choice none: text
    assert parse_completion(CALL, None).content == CALL
    thought = parse_completion(f"<think>3 and 4</think>\n{CALL}", tools, think=True)
    assert thought.reasoning == "3 and 4" and thought.content is None and len(thought.calls) == 1


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": {"add": ADD}}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
        ({"tools": [ADD, ADD]}, "tools"),
        ({"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "mul"}}}, "tool_choice"),
        ({"tools": [ADD], "tool_choice": "always"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [ADD], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ],
)
def test_bad_tool_declarations_are_refused_by_field(body, param):
    from reinforce_pro.agents.tools import ToolError

    with pytest.raises(ToolError) as e:
        tool_request(body)
    assert e.value.param == param


def test_a_template_without_tools_gets_them_written_in_the_chatml_familys_format(tokenizer):
    smol = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, bos_token="<bos>", eos_token="<eos>")
    smol.chat_template = CHATML
    messages = [
        {"role": "user", "content": "3+4="},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 0, "b": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "7"},
        {"role": "tool", "tool_call_id": "c2", "content": "1"},
    ]  # fmt: skip
    text = render_chat(smol, messages, ToolRequest([ADD]), {})
    system, user, assistant, results, prompt = text.split("<|im_start|>")[1:]
    assert system.startswith("system\nYou can call the functions") and json.dumps(ADD) in system
    written = ['<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>',
               '<tool_call>\n{"name": "add", "arguments": {"a": 0, "b": 1}}\n</tool_call>']  # fmt: skip
    assert assistant == f"assistant\n{written[0]}\n{written[1]}<|im_end|>\n"
    assert results == "user\n<tool_response>\n7\n</tool_response>\n<tool_response>\n1\n</tool_response><|im_end|>\n"
    assert prompt == "assistant\n"
    # the calls this endpoint parsed render as the text that was sampled, spacing and all
    sampled = {"c1": '<tool_call>{"name":"add","arguments":{"a":3,"b":4}}</tool_call>'}
    again = render_chat(smol, messages[:2] + [{**messages[2]}], ToolRequest([ADD]), {**sampled, "c2": sampled["c1"]})
    assert '<|im_start|>assistant\n<tool_call>{"name":"add","arguments":{"a":3,"b":4}}</tool_call><|im_end|>' in again


# ---------------------------------------------------------------------------------------------- the OpenAI SDK
def test_a_guide_style_agent_calls_its_tool_and_the_turns_extend_one_sequence(live, tokenizer):
    """Written from the OpenAI function-calling guide: tools=, the reply's tool_calls run, a tool message back."""
    endpoint, engine = live
    sid = endpoint.open_session()
    client = openai.OpenAI(base_url=f"{endpoint.url}/s/{sid}/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "3+4="}]
    reply = client.chat.completions.create(model="policy", messages=messages, tools=[ADD], tool_choice="auto")
    assert reply.choices[0].finish_reason == "tool_calls"
    message = reply.choices[0].message
    messages.append(message)
    for call in message.tool_calls:
        arguments = json.loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(add(**arguments))})
    final = client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
    assert final.choices[0].message.content == "7" and final.choices[0].finish_reason == "stop"
    trajectory = endpoint.close_session(sid).trajectory
    assert trajectory.calls == 2 and trajectory.forks == 0 and trajectory.tool_calls == 1
    first, second = trajectory.segments[0]
    between = tokenizer.decode(second.prompt_ids[len(first.full) :], skip_special_tokens=False)
    assert second.prompt_ids[: len(first.full)] == first.full and between == "\ntool: 7\nassistant: "
    prompt = tokenizer.decode(first.prompt_ids, skip_special_tokens=False)
    assert prompt == "<bos>tools: add(a, b)\nuser: 3+4=\nassistant: "
    # the same question without tools= costs fewer prompt tokens: the tools were rendered
    sid = endpoint.open_session()
    bare = openai.OpenAI(base_url=f"{endpoint.url}/s/{sid}/v1", api_key="none", max_retries=0)
    untooled = bare.chat.completions.create(model="policy", messages=[{"role": "user", "content": "3+4="}])
    assert untooled.usage.prompt_tokens < reply.usage.prompt_tokens
    assert untooled.choices[0].message.tool_calls is None  # no tools declared: the text is not read for calls


def test_streamed_tool_calls_reach_the_sdks_accumulator(live):
    endpoint, _ = live
    sid = endpoint.open_session()
    client = openai.OpenAI(base_url=f"{endpoint.url}/s/{sid}/v1", api_key="none", max_retries=0)
    chunks = list(client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "3+4="}],
                                                 tools=[ADD], stream=True))  # fmt: skip
    calls = [c for chunk in chunks for choice in chunk.choices for c in (choice.delta.tool_calls or [])]
    got = [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls]
    assert got == [(0, "add", {"a": 3, "b": 4})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    endpoint.close_session(sid)


@pytest.mark.parametrize(
    "choice, reply, prefill",
    [
        ("required", '{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "<tool_call>"),
        ({"type": "function", "function": {"name": "add"}}, '{"a": 1, "b": 2}}</tool_call>',
         '<tool_call>{"name": "add", "arguments": '),
    ],
)  # fmt: skip
def test_a_forced_call_is_written_as_the_assistants_first_words_and_only_the_rest_is_sampled(
    tokenizer, choice, reply, prefill
):
    endpoint, engine = serve(tokenizer, {"": [reply]})
    try:
        sid = endpoint.open_session()
        body = {"messages": [{"role": "user", "content": "1+2="}], "tools": [ADD], "tool_choice": choice}
        r = httpx.post(f"{endpoint.url}/s/{sid}/v1/chat/completions", timeout=10, json=body)
        call = r.json()["choices"][0]["message"]["tool_calls"][0]
        assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
        given = tokenizer.decode(engine.given[-1], skip_special_tokens=False)
        assert given.endswith(f"assistant: {prefill}")
        (only,) = endpoint.close_session(sid).trajectory.segments[0]
        assert tokenizer.decode(only.completion_ids, skip_special_tokens=True) == reply  # the prefill is prompt
    finally:
        endpoint.stop()


def test_parallel_tool_calls_false_stops_after_the_first_call(live):
    endpoint, engine = live
    sid = endpoint.open_session()
    body = {"messages": [{"role": "user", "content": "3+4="}], "tools": [ADD], "parallel_tool_calls": False,
            "stop": ["##"]}  # fmt: skip
    r = httpx.post(f"{endpoint.url}/s/{sid}/v1/chat/completions", json=body, timeout=10).json()
    assert engine.stops[-1] == ["##", "</tool_call>"] and r["choices"][0]["finish_reason"] == "tool_calls"
    endpoint.close_session(sid)


@pytest.mark.parametrize(
    "reply",
    [
        '<tool_call>{"name": "add", "arguments": {"a": 3,</tool_call>',
        '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>',
        "<tool_call>" + "x" * 40,
    ],
    ids=["malformed-json", "unknown-tool", "never-closed"],
)
def test_a_sampled_call_that_does_not_parse_comes_back_as_content_and_is_counted(tokenizer, reply):
    endpoint, _ = serve(tokenizer, {"": [reply]})
    try:
        sid = endpoint.open_session()
        r = httpx.post(f"{endpoint.url}/s/{sid}/v1/chat/completions", timeout=10,
                       json={"messages": [{"role": "user", "content": "go"}], "tools": [ADD]}).json()  # fmt: skip
        choice = r["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": reply} and choice["finish_reason"] == "stop"
        trajectory = endpoint.close_session(sid).trajectory
        assert (trajectory.tool_calls, trajectory.tool_call_failures) == (0, 1)
    finally:
        endpoint.stop()


# what a model may write inside a call's tags, each of which once failed the request after the call was recorded
HOSTILE = {
    "name-is-a-list": '<tool_call>{"name": ["add"], "arguments": {}}</tool_call>',  # TypeError: a list in a set
    "nested-1500-deep": '<tool_call>{"name": "add", "arguments": {"a": ' + "[" * 1500 + "]" * 1500 + "}}</tool_call>",
    "nan": '<tool_call>{"name": "add", "arguments": {"a": NaN, "b": 1}}</tool_call>',
    "infinity": '<tool_call>{"name": "add", "arguments": {"a": -Infinity, "b": 1}}</tool_call>',
    "overflow": '<tool_call>{"name": "add", "arguments": {"a": 1e400, "b": 1}}</tool_call>',
    "arguments-a-string-nested": '<tool_call>{"name": "add", "arguments": "' + "[" * 1500 + '"}</tool_call>',
    "2000-unclosed-tags": "<tool_call>" * 2000,
}


@pytest.mark.parametrize("route", ["chat", "messages"])
@pytest.mark.parametrize("reply", list(HOSTILE.values()), ids=list(HOSTILE))
def test_what_a_model_writes_in_a_call_is_content_on_every_route_never_a_failed_request(tokenizer, reply, route):
    endpoint, _ = serve(tokenizer, {"": [reply]}, max_len=32768, max_new=24000)
    try:
        sid = endpoint.open_session()
        if route == "chat":
            r = httpx.post(f"{endpoint.url}/s/{sid}/v1/chat/completions", timeout=30,
                           json={"messages": [{"role": "user", "content": "go"}], "tools": [ADD]})  # fmt: skip
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == reply
        else:
            tools = [{"name": "add", "input_schema": ADD["function"]["parameters"]}]
            r = httpx.post(f"{endpoint.url}/s/{sid}/v1/messages", timeout=30, json={"max_tokens": 24000,
                           "messages": [{"role": "user", "content": "go"}], "tools": tools})  # fmt: skip
            assert r.status_code == 200 and r.json()["content"] == [{"type": "text", "text": reply}]
        trajectory = endpoint.close_session(sid).trajectory
        assert (trajectory.calls, trajectory.tool_calls, trajectory.tool_call_failures) == (1, 0, 1)
    finally:
        endpoint.stop()


def test_a_vocabulary_with_tool_call_as_a_special_token_still_yields_calls(tokenizer):
    """Hermes-2-Pro style: <tool_call> and </tool_call> are special tokens, which a decode that skips special tokens
    drops, so no call was ever found; they are kept in the client's text (<eos> is not), the call is parsed, and
    the next turn extends the sampled ids."""
    hermes = copy.deepcopy(tokenizer)
    hermes.add_tokens(["<tool_call>", "</tool_call>"], special_tokens=True)
    endpoint, engine = serve(hermes, {"3+4=": [CALL, "7"], "": ["ok"]})
    try:
        sampled_ids = hermes(CALL, add_special_tokens=False)["input_ids"]
        assert hermes.convert_tokens_to_ids("<tool_call>") in sampled_ids  # one special token, not 11 characters
        sid = endpoint.open_session()
        client = openai.OpenAI(base_url=f"{endpoint.url}/s/{sid}/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "3+4="}]
        first = client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        (call,) = first.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 3, "b": 4})
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "7"}]  # fmt: skip
        assert (
            client.chat.completions.create(model="policy", messages=messages, tools=[ADD]).choices[0].message.content
            == "7"
        )
        trajectory = endpoint.close_session(sid).trajectory
        assert (trajectory.calls, trajectory.forks, trajectory.tool_calls) == (2, 0, 1)
    finally:
        endpoint.stop()


def test_a_parser_that_fails_on_a_recorded_call_still_answers_with_the_text(tokenizer, monkeypatch):
    """The call is recorded before its reply is read: should reading it ever raise, the reply is the text as
    content (a failed call, counted), not a 500 that makes the agent retry from a fork of what it saw."""
    from reinforce_pro.agents import openai_app

    def broken(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(openai_app, "parse_completion", broken)
    endpoint, _ = serve(tokenizer, {"": [CALL]})
    try:
        sid = endpoint.open_session()
        r = httpx.post(f"{endpoint.url}/s/{sid}/v1/chat/completions", timeout=10,
                       json={"messages": [{"role": "user", "content": "go"}], "tools": [ADD]})  # fmt: skip
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == CALL
        trajectory = endpoint.close_session(sid).trajectory
        assert (trajectory.calls, trajectory.tool_call_failures) == (1, 1)
    finally:
        endpoint.stop()


def test_reading_calls_takes_linear_time_in_a_reply_of_unclosed_tags():
    """20,000 unclosed tags (a model looping on a one-token <tool_call>): a lazy regex scanned to the end from each
    of them (1.5 s at 4,000, so ~37 s here, on the loop that serves every session); one pass takes milliseconds."""
    tools = ToolRequest([ADD])
    started = time.perf_counter()
    parsed = parse_completion("<tool_call>" * 20_000, tools)
    assert parsed.failed and parsed.calls == [] and time.perf_counter() - started < 1.0
    closed = parse_completion(CALL + "<tool_call>x</tool_call>" * 20_000, tools)  # a bad call among many: content
    assert closed.failed and closed.calls == []
    started = time.perf_counter()  # a string never closed, full of escaped quotes: the depth check stays linear
    escaped = parse_completion(
        '<tool_call>{"name": "add", "arguments": {"a": "' + '\\"' * 20_000 + "</tool_call>", tools
    )
    assert escaped.failed and time.perf_counter() - started < 1.0


def _history(calls: int) -> list[dict]:
    return [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": "add", "arguments": "{}"}} for k in range(calls)]},
    ]  # fmt: skip


@pytest.mark.parametrize(
    "body, status, code",
    [
        pytest.param({"tools": [{"type": "function", "function": {"name": "add", "parameters": "x" * MAX_BODY_BYTES}}]},
                     413, "body_too_large", id="1MiB-schema"),
        pytest.param({"tools": [{"type": "code_interpreter"}]}, 400, "invalid", id="not-a-function-tool"),
        pytest.param({"messages": [{"role": "user", "content": "go"}, {"role": "tool", "tool_call_id": "c9",
                      "content": "7"}]}, 400, "invalid", id="tool-message-without-its-call"),
        pytest.param({"messages": [*_history(1), {"role": "tool", "tool_call_id": "c0", "content": "1"},
                                   {"role": "tool", "tool_call_id": "c0", "content": "2"}]},
                     400, "invalid", id="a-call-answered-twice"),
        pytest.param({"messages": [*_history(1), *_history(1)[1:]]}, 400, "invalid", id="call-ids-reused"),
        pytest.param({"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [
                      {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{a: 1"}}]}]},
                     400, "invalid", id="call-arguments-not-json"),
        pytest.param({"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [
                      {"type": "function", "function": {"name": "add"}}]}]}, 400, "invalid", id="call-without-id"),
        pytest.param({"messages": _history(300)}, 400, "context_length_exceeded", id="300-calls-in-a-reply"),
    ],
)  # fmt: skip
def test_hostile_tool_traffic_gets_a_defined_answer_and_the_endpoint_keeps_serving(live, body, status, code):
    endpoint, engine = live
    sid = endpoint.open_session()
    r = httpx.post(f"{endpoint.url}/s/{sid}/v1/chat/completions", timeout=10,
                   json={"messages": [{"role": "user", "content": "go"}], "tools": [ADD], **body})  # fmt: skip
    assert (r.status_code, r.json()["error"]["code"]) == (status, code)
    ok = httpx.post(f"{endpoint.url}/s/{sid}/v1/chat/completions", timeout=10,
                    json={"messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "ok"
    assert endpoint.close_session(sid).trajectory.calls == 1


# ---------------------------------------------------------------------------------------------- Anthropic
def test_the_anthropic_sdk_gets_tool_use_blocks_and_its_tool_results_extend_the_sequence(live, tokenizer):
    anthropic = pytest.importorskip("anthropic")
    endpoint, _ = live
    sid = endpoint.open_session()
    client = anthropic.Anthropic(base_url=f"{endpoint.url}/s/{sid}", api_key="none", max_retries=0)
    tools = [{"name": "add", "description": "Add two integers", "input_schema": ADD["function"]["parameters"]}]
    messages = [{"role": "user", "content": "3+4="}]
    reply = client.messages.create(model="policy", max_tokens=90, messages=messages, tools=tools)
    assert reply.stop_reason == "tool_use"
    (use,) = [b for b in reply.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("add", {"a": 3, "b": 4})
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "7"}
    messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": [result]}]
    final = client.messages.create(model="policy", max_tokens=90, messages=messages, tools=tools)
    assert final.content[0].text == "7" and final.stop_reason == "end_turn"
    trajectory = endpoint.close_session(sid).trajectory
    assert trajectory.calls == 2 and trajectory.forks == 0 and trajectory.tool_calls == 1


def test_the_anthropic_sdks_tool_loop_on_a_think_template_echoes_its_thinking_block_and_is_served(tokenizer):
    """A template with <think> (Qwen3's family): the reply's reasoning comes back as a thinking block, which the
    SDK's own loop sends back in the next request's assistant turn; that turn is served (it was a 400), and the
    call's sampled text, reasoning included, is what the next prompt extends."""
    anthropic = pytest.importorskip("anthropic")
    from reinforce_pro.models.tiny import CHAT_TEMPLATE

    thinking = copy.deepcopy(tokenizer)
    thinking.chat_template = CHAT_TEMPLATE + "{#- a reply may open with <think>...</think> -#}"
    endpoint, _ = serve(thinking, {"3+4=": ["<think>add them</think>" + CALL, "7"], "": ["ok"]})
    try:
        sid = endpoint.open_session()
        client = anthropic.Anthropic(base_url=f"{endpoint.url}/s/{sid}", api_key="none", max_retries=0)
        tools = [{"name": "add", "description": "Add two integers", "input_schema": ADD["function"]["parameters"]}]
        messages = [{"role": "user", "content": "3+4="}]
        reply = client.messages.create(model="policy", max_tokens=4096, messages=messages, tools=tools)
        assert [b.type for b in reply.content] == ["thinking", "tool_use"] and reply.content[0].thinking == "add them"
        result = {"type": "tool_result", "tool_use_id": reply.content[1].id, "content": "7"}
        messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": [result]}]
        final = client.messages.create(model="policy", max_tokens=4096, messages=messages, tools=tools)
        assert final.content[0].text == "7"
        trajectory = endpoint.close_session(sid).trajectory
        assert (trajectory.calls, trajectory.forks, trajectory.tool_calls, trajectory.clamped) == (2, 0, 1, 2)
    finally:
        endpoint.stop()


# ---------------------------------------------------------------------------------------------- Responses API
def test_the_responses_api_serves_function_calls_and_their_outputs_extend_the_sequence(live, tokenizer):
    endpoint, _ = live
    sid = endpoint.open_session()
    client = openai.OpenAI(base_url=f"{endpoint.url}/s/{sid}/v1", api_key="none", max_retries=0)
    tool = {"type": "function", "name": "add", "description": "Add", "parameters": ADD["function"]["parameters"]}
    items: list = [{"role": "user", "content": "3+4="}]
    first = client.responses.create(model="policy", input=items, tools=[tool], instructions="Use the tool.")
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("add", {"a": 3, "b": 4}) and first.status == "completed"
    items += [item.model_dump() for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "7"})
    second = client.responses.create(model="policy", input=items, tools=[tool], instructions="Use the tool.")
    assert second.output_text == "7" and second.usage.output_tokens == 2
    trajectory = endpoint.close_session(sid).trajectory
    assert trajectory.calls == 2 and trajectory.forks == 0
    prompt = tokenizer.decode(trajectory.segments[0][0].prompt_ids, skip_special_tokens=False)
    assert prompt == "<bos>tools: add(a, b)\nsystem: Use the tool.\nuser: 3+4=\nassistant: "


def test_a_streamed_response_ends_with_the_whole_response(live):
    endpoint, _ = live
    sid = endpoint.open_session()
    client = openai.OpenAI(base_url=f"{endpoint.url}/s/{sid}/v1", api_key="none", max_retries=0)
    events = list(client.responses.create(model="policy", input="hi", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response.output_text == "ok"
    endpoint.close_session(sid)


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input"),
        ({"input": []}, "input"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text"),
    ],
)
def test_what_the_responses_route_cannot_serve_is_refused_by_name(live, extra, param):
    endpoint, _ = live
    sid = endpoint.open_session()
    r = httpx.post(f"{endpoint.url}/s/{sid}/v1/responses", json={"model": "policy", "input": "hi", **extra}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    endpoint.close_session(sid)
