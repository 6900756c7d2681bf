"""The routes of the OpenAI-compatible endpoint (agents/openai_endpoint.py), as a FastAPI app.

Requests are read with a size cap and parsed here; the endpoint decides the sampling and records the call. Every
refusal is an OpenAI-style JSON error (the SDK raises BadRequestError, NotFoundError, ...), never a traceback.
Anthropic's Messages API (POST /v1/messages, the wire format of the `anthropic` SDK) is served beside it: the
same sessions, sampling and recording, Anthropic's request, response and error shapes; and OpenAI's Responses API
(POST /v1/responses, which the OpenAI Agents SDK uses), read into the same chat conversation
(agents/responses_api.py). Every chat-shaped route takes tools and returns parsed tool calls (agents/tools.py).

`stream: true` is answered as server-sent events in each API's chunk format. The engines sample whole
completions (requests are batched across sessions), so the stream starts once the completion is sampled and
carries its text in one delta: a streaming client works unchanged, and sees no tokens early.
"""

from __future__ import annotations

import json
import math
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import ClientDisconnect

from reinforce_pro.agents import responses_api
from reinforce_pro.agents.tools import (
    CLOSE,
    Parsed,
    ToolError,
    ToolRequest,
    finish_reason,
    parse_completion,
    remember_calls,
    render_chat,
    template_tools,
    tool_request,
)
from reinforce_pro.agents.trajectory import Call
from reinforce_pro.rollout.sampler import client_text

MAX_BODY_BYTES = 1 << 20  # a request body above this is refused (413) before it is parsed
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


class EndpointError(Exception):
    """A request refused with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, code: str = "invalid_request", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "code": self.code, "param": self.param}}

    def anthropic_body(self) -> dict:
        """The error as Anthropic's API writes it (its SDK raises BadRequestError, NotFoundError, ... from it)."""
        kind = ANTHROPIC_ERRORS.get(self.status, "invalid_request_error" if self.status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}


THINKING = ("thinking", "redacted_thinking")  # Anthropic's reasoning blocks
ANTHROPIC_ERRORS = {404: "not_found_error", 413: "request_too_large", 503: "overloaded_error"}


def build_app(endpoint) -> FastAPI:
    """The routes of `endpoint` (an openai_endpoint.Endpoint: its sessions, sampling and batcher)."""
    app = FastAPI(title="reinforce_pro rollout endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    routes = Routes(endpoint)

    @app.exception_handler(EndpointError)
    async def refused(request: Request, e: EndpointError):
        return JSONResponse(e.body(), status_code=e.status)

    app.add_api_route("/health", routes.health, methods=["GET"])
    for prefix in ("/v1", "/s/{sid}/v1"):
        app.add_api_route(f"{prefix}/models", routes.models, methods=["GET"])
        app.add_api_route(f"{prefix}/chat/completions", routes.chat, methods=["POST"])
        app.add_api_route(f"{prefix}/completions", routes.completions, methods=["POST"])
        app.add_api_route(f"{prefix}/messages", routes.messages, methods=["POST"])
        app.add_api_route(f"{prefix}/responses", routes.responses, methods=["POST"])
    return app


class Routes:
    """The handlers of one endpoint's routes; `sid` is the session named in the path (/s/{sid}/v1/...)."""

    def __init__(self, endpoint):
        self.endpoint = endpoint

    async def health(self):
        endpoint = self.endpoint
        return {"status": "ok", "model": endpoint.model_name, "sessions": len(endpoint.sessions)}

    async def models(self):
        return {"object": "list", "data": [{"id": self.endpoint.model_name, "object": "model", "created": 0,
                                            "owned_by": "reinforce_pro"}]}  # fmt: skip

    async def chat(self, request: Request, sid: str | None = None):
        endpoint = self.endpoint
        body = await read_body(request)
        session = endpoint.session_for(sid, request.headers.get("x-session-id"), body)
        messages, continue_last = body.get("messages"), continued(body)
        call, parsed = await self.sample_chat(request, session, messages, body, requested_tools(body), continue_last,
                                              template_kwargs(body))  # fmt: skip
        message = chat_message(parsed)
        finish = finish_reason(call, parsed)
        if body.get("stream"):
            delta = {**message, "tool_calls": [{"index": k, **c} for k, c in enumerate(parsed.calls)]}
            return openai_stream("chat.completion.chunk", body, call, {"delta": delta}, {"delta": {}}, finish)
        return response("chat.completion", body, call, {"message": message, "finish_reason": finish},
                        endpoint.tokenizer)  # fmt: skip

    async def completions(self, request: Request, sid: str | None = None):
        endpoint = self.endpoint
        body = await read_body(request)
        session = endpoint.session_for(sid, request.headers.get("x-session-id"), body)
        prompt = body.get("prompt")
        if isinstance(prompt, list):  # token ids in: exactly these
            ids = completion_prompt_ids(endpoint.tokenizer, prompt)
            call = await endpoint.complete(session, None, ids, body, request.is_disconnected)
        else:
            text = completion_prompt_text(prompt)
            ids = endpoint.prompt_ids(session, text, with_bos=True)
            call = await endpoint.complete(session, text, ids, body, request.is_disconnected)
        if body.get("stream"):
            return openai_stream("text_completion", body, call, {"text": call.text}, {"text": ""})
        return response("text_completion", body, call, {"text": call.text}, endpoint.tokenizer)

    async def messages(self, request: Request, sid: str | None = None):
        """Anthropic's Messages API: a conversation (and `system`, `tools`) in, one assistant message out. A last
        message from the assistant is continued (Anthropic's prefill), not answered."""
        endpoint = self.endpoint
        try:
            body = await read_body(request)
            session = endpoint.session_for(sid, request.headers.get("x-session-id"), body)
            conversation, sampling, tools = anthropic_request(body)
            prefilled = conversation[-1]["role"] == "assistant"
            call, parsed = await self.sample_chat(request, session, conversation, sampling, tools, prefilled)
        except EndpointError as e:
            return JSONResponse(e.anthropic_body(), status_code=e.status)
        message = message_response(body, sampling.get("stop") or [], call, endpoint.tokenizer, parsed)
        return anthropic_stream(message) if body.get("stream") else message

    async def responses(self, request: Request, sid: str | None = None):
        """OpenAI's Responses API (agents/responses_api.py), served as the chat conversation it writes."""
        endpoint = self.endpoint
        body = await read_body(request)
        session = endpoint.session_for(sid, request.headers.get("x-session-id"), body)
        try:
            messages, chat = responses_api.chat_request(body)
        except ToolError as e:
            raise refused(e) from None
        call, parsed = await self.sample_chat(request, session, messages, chat, requested_tools(chat))
        out = responses_api.response_object(body, call, parsed)
        return sse(responses_api.stream_events(out)) if body.get("stream") else out

    async def sample_chat(self, request: Request, session, messages, body: dict, tools: ToolRequest | None,
                          continue_last: bool = False, kwargs: dict | None = None) -> tuple[Call, Parsed]:  # fmt: skip
        """A chat conversation rendered with `tools` (a forced call's first words after the generation prompt,
        unless the last message is continued), sampled with the body's settings and recorded, and its reply read
        for tool calls: the chat, Messages and Responses routes' common path."""
        endpoint = self.endpoint
        text = chat_prompt_text(endpoint.tokenizer, messages, tools, session.sampled_calls, continue_last, kwargs)
        text += (prefill := "" if continue_last else forced_call(endpoint.tokenizer, tools))
        ids = endpoint.prompt_ids(session, text, with_bos=False)
        call = await endpoint.complete(session, text, ids, body, request.is_disconnected, kept_stop(tools))
        return call, read_reply(endpoint.tokenizer, session, tools, prefill + call.text)


async def read_body(request: Request) -> dict:
    """The JSON object of the request, refusing a body above MAX_BODY_BYTES before reading all of it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise EndpointError(413, f"the request body is above {MAX_BODY_BYTES} bytes", "body_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise EndpointError(413, f"the request body is above {MAX_BODY_BYTES} bytes", "body_too_large")
            chunks.append(chunk)
    except ClientDisconnect:  # the client hung up mid-body: nobody reads the answer, and nothing is logged
        raise EndpointError(499, "the client disconnected before its request arrived", "client_closed") from None
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: arrays nested thousands deep
        raise EndpointError(400, "the request body is not valid JSON", "invalid_json") from None
    if not isinstance(body, dict):
        raise EndpointError(400, "the request body must be a JSON object", "invalid_json")
    return body


def chat_prompt_text(tokenizer, messages, tools: ToolRequest | None = None, sampled: dict | None = None,
                     continue_last: bool = False, kwargs: dict | None = None) -> str:  # fmt: skip
    """The text the tokenizer's chat template gives `messages` (and `tools`): with the assistant's generation
    prompt, or (`continue_last`) ending inside the last message, which the completion continues. `sampled`: the
    session's tool call ids -> the text sampled with them (agents/tools.py)."""
    try:
        return render_chat(tokenizer, messages, tools, sampled or {}, continue_last, kwargs)
    except ToolError as e:
        raise refused(e) from None


# the chat template's own arguments, which chat_template_kwargs may not set
RENDERING = {"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
             "continue_final_message", "tokenize", "return_dict", "return_tensors", "padding",
             "truncation"}  # fmt: skip


def template_kwargs(body: dict) -> dict:
    """vLLM's chat_template_kwargs (Qwen3's enable_thinking: false): more variables for the chat template."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or RENDERING & set(kwargs):
        raise EndpointError(400, "chat_template_kwargs must be an object of template variables other than "
                            f"{', '.join(sorted(RENDERING))}", "invalid", "chat_template_kwargs")  # fmt: skip
    return kwargs


def continued(body: dict) -> bool:
    """vLLM's continue_final_message: the last (assistant) message is continued, not answered."""
    value = body.get("continue_final_message", False)
    if not isinstance(value, bool):
        raise EndpointError(400, "continue_final_message must be true or false", "invalid", "continue_final_message")
    messages = body.get("messages")
    if value and not (isinstance(messages, list) and messages and isinstance(messages[-1], dict)
                      and messages[-1].get("role") == "assistant"):  # fmt: skip
        raise EndpointError(400, "continue_final_message needs an assistant message last", "invalid",
                            "continue_final_message")  # fmt: skip
    if value and body.get("add_generation_prompt"):
        raise EndpointError(400, "continue_final_message and add_generation_prompt cannot both be true", "invalid",
                            "add_generation_prompt")  # fmt: skip
    return value


def requested_tools(body: dict) -> ToolRequest | None:
    try:
        return tool_request(body)
    except ToolError as e:
        raise refused(e) from None


def refused(e: ToolError) -> EndpointError:
    """A tool declaration or tool turn that cannot be served, as the 400 naming its field."""
    return EndpointError(400, str(e), e.code, e.param)


def forced_call(tokenizer, tools: ToolRequest | None) -> str:
    """The text a forced tool call starts with (tool_choice "required" or a named function), written after the
    generation prompt as the assistant's first words: the engine continues it, and only what it samples is
    trained. "" when the model chooses."""
    if tools is None or tools.choice in ("auto", "none"):
        return ""
    opener = template_tools(tokenizer).opener
    return opener if tools.choice == "required" else opener + f'{{"name": "{tools.choice}", "arguments": '


def kept_stop(tools: ToolRequest | None) -> str | None:
    """parallel_tool_calls false: sampling stops after the first call's closing tag."""
    return CLOSE if tools is not None and tools.parses and not tools.parallel else None


def read_reply(tokenizer, session, tools: ToolRequest | None, text: str) -> Parsed:
    """The reply's content, reasoning and tool calls; the calls are filed under the sampled text."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    try:
        parsed = parse_completion(text, tools, think="<think>" in template)
    except Exception:  # the call is recorded already: whatever the model wrote ends as content, never as a 500
        parsed = Parsed(text, [], failed=tools is not None and tools.parses)
    remember_calls(session, parsed, text)
    return parsed


def chat_message(parsed: Parsed) -> dict:
    message = {"role": "assistant", "content": parsed.content}
    if parsed.calls:
        message["tool_calls"] = parsed.calls
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    return message


def completion_prompt_text(prompt) -> str:
    if isinstance(prompt, str) and prompt:
        return prompt
    raise EndpointError(400, "prompt must be a non-empty string or a list of token ids", "invalid", "prompt")


def completion_prompt_ids(tokenizer, prompt: list) -> list[int]:
    """A completion's prompt given as token ids (token in, token out): used exactly as given."""
    vocab = len(tokenizer)
    if prompt and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt):
        return list(prompt)
    raise EndpointError(400, f"prompt ids must be a non-empty list of token ids below {vocab}", "invalid", "prompt")


def response(kind: str, body: dict, call: Call, choice: dict, tokenizer) -> dict:
    """OpenAI's response object, with the engine's ids (`token_ids`) and, when asked, the log-probs in the
    route's shape (chat's `content` entries, the completions route's `tokens` / `token_logprobs`)."""
    logprobs = None
    if logprobs_asked(body):
        logprobs = (chat_logprobs if kind == "chat.completion" else completion_logprobs)(call, tokenizer)
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
        "object": kind,
        "created": int(time.time()),
        "model": body.get("model") or "policy",
        "choices": [{"index": 0, "finish_reason": call.finish_reason, **choice, "logprobs": logprobs}],
        "usage": {
            "prompt_tokens": len(call.prompt_ids),
            "completion_tokens": len(call.completion_ids),
            "total_tokens": len(call.prompt_ids) + len(call.completion_ids),
        },  # fmt: skip
        "token_ids": {"prompt_token_ids": call.prompt_ids, "completion_token_ids": call.completion_ids},
    }


def logprobs_asked(body: dict) -> bool:
    """Whether the response carries log-probs: chat's `logprobs: true`, or the completions route's integer
    `logprobs` (0 included: the sampled token's alone)."""
    value = body.get("logprobs")
    return value is True or (isinstance(value, int) and not isinstance(value, bool))


def top_logprobs(body: dict) -> int:
    """How many likeliest tokens per position a request asks for: chat's top_logprobs (with logprobs true), or the
    completions route's integer logprobs; 0..MAX_TOP_LOGPROBS, anything else a 400 naming the field."""
    value, key = body.get("logprobs"), "logprobs"
    if value is True or value in (None, False):
        value, key = body.get("top_logprobs"), "top_logprobs"
        if value not in (None, 0) and body.get("logprobs") is not True:
            raise EndpointError(400, "top_logprobs needs logprobs: true", "invalid", "top_logprobs")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise EndpointError(400, f"{key} must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {value!r}", "invalid",
                            key)  # fmt: skip
    return value


def _finite(value: float) -> float | None:
    """A log-prob as JSON can carry it: the engine's NaN or -inf (a position it returned none for, a token its
    own filter removed) is null, never a 500 from the strict encoder."""
    return value if math.isfinite(value) else None


def _tops(call: Call, i: int) -> list[tuple[int, float]]:
    return call.top_log_probs[i] if call.top_log_probs is not None and i < len(call.top_log_probs) else []


def chat_logprobs(call: Call, tokenizer) -> dict:
    """Chat Completions' logprobs: per completion id its token, id, log-prob and the likeliest tokens asked for."""

    def token(t: int, lp: float) -> dict:
        text = tokenizer.decode([t])
        return {"token": text, "token_id": t, "logprob": _finite(lp), "bytes": list(text.encode())}

    pairs = enumerate(zip(call.completion_ids, call.log_probs, strict=True))
    return {"content": [{**token(t, lp), "top_logprobs": [token(u, ulp) for u, ulp in _tops(call, i)]}
                        for i, (t, lp) in pairs]}  # fmt: skip


def completion_logprobs(call: Call, tokenizer) -> dict:
    """The completions route's (legacy) logprobs: tokens, their log-probs, each position's likeliest tokens as
    {token: log-prob}, and where each token's text starts in the completion's text."""
    tokens = [tokenizer.decode([t]) for t in call.completion_ids]
    offsets = [sum(map(len, tokens[:i])) for i in range(len(tokens))]
    tops = None
    if call.top_log_probs is not None:
        tops = [{tokenizer.decode([u]): _finite(ulp) for u, ulp in _tops(call, i)} for i in range(len(tokens))]
    return {"tokens": tokens, "token_logprobs": [_finite(lp) for lp in call.log_probs], "top_logprobs": tops,
            "text_offset": offsets}  # fmt: skip


def anthropic_request(body: dict) -> tuple[list[dict], dict, ToolRequest | None]:
    """(the conversation as OpenAI chat messages, the request's sampling fields as the OpenAI routes name them,
    its tools as OpenAI declares them) of a Messages API body: `system` becomes a first system message, text
    blocks text, `tool_use` blocks an assistant's tool calls, `tool_result` blocks tool messages; a request the
    trainer could not replay (images, extended thinking) is refused by name."""
    if not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool):
        raise EndpointError(400, "max_tokens: a positive integer is required", "invalid", "max_tokens")
    thinking = body.get("thinking")
    if thinking and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise EndpointError(400, "thinking is not served: the policy writes what it thinks in its text", "unsupported",
                            "thinking")  # fmt: skip
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise EndpointError(400, "messages must be a non-empty list", "invalid", "messages")
    conversation = []
    system = body.get("system")
    if system:
        conversation.append({"role": "system", "content": _blocks(system, "system")})
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise EndpointError(400, f"messages[{i}].role must be user or assistant", "invalid", "messages")
        conversation += _anthropic_turn(m, f"messages[{i}].content")
    stops = body.get("stop_sequences")
    sampling = {key: body.get(key) for key in ("max_tokens", "temperature", "top_p", "top_k", "stream")}
    return conversation, {**sampling, "stop": stops if stops else None}, anthropic_tools(body)


def anthropic_tools(body: dict) -> ToolRequest | None:
    """Anthropic's `tools` (name, description, input_schema) and `tool_choice` (auto, any, tool, none) as the
    OpenAI routes declare them."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        return requested_tools({"tool_choice": None if choice in (None, {"type": "none"}) else choice})
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise EndpointError(400, "tools must be a list of tool objects", "invalid", "tools")
    for i, t in enumerate(tools):
        if t.get("type") not in (None, "custom"):
            raise EndpointError(400, f"tools[{i}]: only client tools (name, input_schema) are served, not "
                                f"{t.get('type')!r}", "unsupported", "tools")  # fmt: skip
    functions = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description"),
                  "parameters": t.get("input_schema", {})}} for t in tools]  # fmt: skip
    kind = choice.get("type") if isinstance(choice, dict) else None
    named = {"type": "function", "function": {"name": choice.get("name")}} if kind == "tool" else None
    openai_choice = {None: "auto", "auto": "auto", "any": "required", "none": "none", "tool": named}.get(kind, choice)
    parallel = not (isinstance(choice, dict) and choice.get("disable_parallel_tool_use"))
    return requested_tools({"tools": functions, "tool_choice": openai_choice, "parallel_tool_calls": parallel})


def _anthropic_turn(m: dict, where: str) -> list[dict]:
    """One Messages API turn as chat messages: an assistant's text and tool_use blocks as one message with
    tool_calls; a user's tool_result blocks as tool messages, then its text (if any) as a user message."""
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": m["role"], "content": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise EndpointError(400, f"{where}: a string or a list of content blocks", "invalid", "messages")
    # an assistant's thinking blocks are its own earlier replies' reasoning, echoed back by the SDK's tool loop:
    # passed over, as the chat route passes over reasoning_content (a call this endpoint parsed is rendered as the
    # text it sampled, reasoning and all; a template decides what earlier reasoning the next prompt keeps)
    kinds = {"assistant": ("text", "tool_use", *THINKING), "user": ("text", "tool_result")}[m["role"]]
    if any(b.get("type") not in kinds for b in content):
        raise EndpointError(400, f"{where}: only {' and '.join(kinds)} blocks are served in a {m['role']} turn",
                            "unsupported", where)  # fmt: skip
    text = "".join(str(b.get("text", "")) for b in content if b["type"] == "text")
    if m["role"] == "assistant":
        calls = [{"id": b.get("id"), "type": "function", "function": {"name": b.get("name"),
                  "arguments": b.get("input", {})}} for b in content if b["type"] == "tool_use"]  # fmt: skip
        return [{"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}]
    results = [{"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _blocks(b.get("content") or "",
                f"{where} tool_result")} for b in content if b["type"] == "tool_result"]  # fmt: skip
    return results + ([{"role": "user", "content": text}] if text or not results else [])


def _blocks(content, where: str) -> str:
    """Anthropic content: a string or a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "".join(str(b.get("text", "")) for b in content)
    raise EndpointError(400, f"{where}: only text blocks are served", "unsupported", where)


def message_response(body: dict, stops: list[str], call: Call, tokenizer, parsed: Parsed) -> dict:
    """Anthropic's Message object, with the engine's ids (`token_ids`, as the OpenAI routes add them)."""
    sampled = client_text(tokenizer, call.completion_ids)
    stop = next((s for s in stops if s in sampled), None)
    reason = "max_tokens" if call.finish_reason == "length" else "stop_sequence" if stop else "end_turn"
    blocks = [{"type": "thinking", "thinking": parsed.reasoning, "signature": ""}] if parsed.reasoning else []
    if parsed.content or not parsed.calls:
        blocks.append({"type": "text", "text": parsed.content or ""})
    blocks += [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                "input": json.loads(c["function"]["arguments"])} for c in parsed.calls]  # fmt: skip
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or "policy",
        "content": blocks,
        "stop_reason": "tool_use" if parsed.calls else reason,
        "stop_sequence": stop if not parsed.calls else None,
        "usage": {"input_tokens": len(call.prompt_ids), "output_tokens": len(call.completion_ids)},
        "token_ids": {"prompt_token_ids": call.prompt_ids, "completion_token_ids": call.completion_ids},
    }


def sse(events) -> StreamingResponse:
    """Server-sent events: each (event name or None, JSON-able data or a literal string) as one event."""

    def lines():
        for name, data in events:
            head = f"event: {name}\n" if name else ""
            yield f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream")


def openai_stream(kind: str, body: dict, call: Call, first: dict, last: dict, finish: str | None = None
                  ) -> StreamingResponse:  # fmt: skip
    """An OpenAI stream of a sampled completion: the text in one chunk, then the finish reason with the engine's
    ids (`token_ids`), the usage when `stream_options.include_usage` asks, then [DONE]."""
    prefix = "chatcmpl" if kind == "chat.completion.chunk" else "cmpl"
    head = {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
            "model": body.get("model") or "policy"}  # fmt: skip
    ids = {"prompt_token_ids": call.prompt_ids, "completion_token_ids": call.completion_ids}
    events = [
        (None, {**head, "choices": [{"index": 0, **first, "finish_reason": None, "logprobs": None}]}),
        (None, {**head, "choices": [{"index": 0, **last, "finish_reason": finish or call.finish_reason,
                                     "logprobs": None}],
                "token_ids": ids}),
    ]  # fmt: skip
    if (body.get("stream_options") or {}).get("include_usage"):
        total = len(call.prompt_ids) + len(call.completion_ids)
        usage = {"prompt_tokens": len(call.prompt_ids), "completion_tokens": len(call.completion_ids),
                 "total_tokens": total}  # fmt: skip
        events.append((None, {**head, "choices": [], "usage": usage}))
    return sse([*events, (None, "[DONE]")])


def anthropic_stream(message: dict) -> StreamingResponse:
    """Anthropic's event stream of a sampled Message: start, each content block whole in one delta (thinking,
    text, tool_use), the stop reason."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 0}}  # fmt: skip
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    events = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        empty, delta = _block_delta(block)
        events += [
            {"type": "content_block_start", "index": index, "content_block": empty},
            {"type": "content_block_delta", "index": index, "delta": delta},
            {"type": "content_block_stop", "index": index},
        ]
    events += [
        {"type": "message_delta", "delta": stop, "usage": {"output_tokens": usage["output_tokens"]}},
        {"type": "message_stop"},
    ]
    return sse([(e["type"], e) for e in events])  # each event is named by its type, as Anthropic's are


def _block_delta(block: dict) -> tuple[dict, dict]:
    """(the block as its start event gives it, the one delta that fills it)."""
    if block["type"] == "tool_use":
        return {**block, "input": {}}, {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    if block["type"] == "thinking":
        return {**block, "thinking": ""}, {"type": "thinking_delta", "thinking": block["thinking"]}
    return {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
