"""The routes of the OpenAI-compatible endpoint (agents/openai_endpoint.py), as a FastAPI app.

Requests are read with a size cap and parsed here; the endpoint decides the sampling and records the call. Every
refusal is an OpenAI-style JSON error (the SDK raises BadRequestError, NotFoundError, ...), never a traceback.
Anthropic's Messages API (POST /v1/messages, the wire format of the `anthropic` SDK) is served beside it: the
same sessions, sampling and recording, Anthropic's request, response and error shapes.

`stream: true` is answered as server-sent events in each API's chunk format. The engines sample whole
completions (requests are batched across sessions), so the stream starts once the completion is sampled and
carries its text in one delta: a streaming client works unchanged, and sees no tokens early.
"""

from __future__ import annotations

import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from reinforce_pro.agents.trajectory import Call

MAX_BODY_BYTES = 1 << 20  # a request body above this is refused (413) before it is parsed


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
        text = chat_prompt_text(endpoint.tokenizer, body.get("messages"))
        ids = endpoint.prompt_ids(session, text, with_bos=False)
        call = await endpoint.complete(session, text, ids, body, request.is_disconnected)
        message = {"role": "assistant", "content": call.text}
        if body.get("stream"):
            return openai_stream("chat.completion.chunk", body, call, {"delta": message}, {"delta": {}})
        return response("chat.completion", body, call, {"message": message}, endpoint.tokenizer)

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
        """Anthropic's Messages API: a conversation (and `system`) in, one assistant message out. A last message
        from the assistant is continued (Anthropic's prefill), not answered."""
        endpoint = self.endpoint
        try:
            body = await read_body(request)
            session = endpoint.session_for(sid, request.headers.get("x-session-id"), body)
            conversation, sampling = anthropic_request(body)
            text = chat_prompt_text(
                endpoint.tokenizer, conversation, continue_last=conversation[-1]["role"] == "assistant"
            )
            ids = endpoint.prompt_ids(session, text, with_bos=False)
            call = await endpoint.complete(session, text, ids, sampling, request.is_disconnected)
        except EndpointError as e:
            return JSONResponse(e.anthropic_body(), status_code=e.status)
        message = message_response(body, sampling.get("stop") or [], call, endpoint.tokenizer)
        return anthropic_stream(message) if body.get("stream") else message


async def read_body(request: Request) -> dict:
    """The JSON object of the request, refusing a body above MAX_BODY_BYTES before reading all of it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise EndpointError(413, f"the request body is above {MAX_BODY_BYTES} bytes", "body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise EndpointError(413, f"the request body is above {MAX_BODY_BYTES} bytes", "body_too_large")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError):
        raise EndpointError(400, "the request body is not valid JSON", "invalid_json") from None
    if not isinstance(body, dict):
        raise EndpointError(400, "the request body must be a JSON object", "invalid_json")
    return body


def chat_prompt_text(tokenizer, messages, continue_last: bool = False) -> str:
    """The text the tokenizer's chat template gives `messages`: with the assistant's generation prompt, or
    (`continue_last`) ending inside the last message, which the completion continues."""
    if not isinstance(messages, list) or not messages:
        raise EndpointError(400, "messages must be a non-empty list", "invalid", "messages")
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise EndpointError(400, f"messages[{i}] must be an object with a role", "invalid", "messages")
        plain.append({"role": m["role"], "content": _text(m.get("content"), i)})
    try:
        if continue_last:
            return tokenizer.apply_chat_template(plain, tokenize=False, continue_final_message=True)
        return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # a template that refuses these messages (a role it does not know)
        raise EndpointError(400, f"the chat template refused the messages: {e}", "invalid", "messages") from None


def _text(content, i: int) -> str:
    """A message's content as text: a string, or OpenAI's list of parts of which only text parts are served."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise EndpointError(400, f"messages[{i}].content: only text is served", "unsupported", "messages")


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
    """OpenAI's response object, with the engine's ids (`token_ids`) and, when asked, the log-probs."""
    logprobs = None
    if body.get("logprobs"):
        entries = [{"token": tokenizer.decode([t]), "token_id": t, "logprob": lp, "bytes": None, "top_logprobs": []}
                   for t, lp in zip(call.completion_ids, call.log_probs, strict=True)]  # fmt: skip
        logprobs = {"content": entries}
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
        "object": kind,
        "created": int(time.time()),
        "model": body.get("model") or "policy",
        "choices": [{"index": 0, **choice, "finish_reason": call.finish_reason, "logprobs": logprobs}],
        "usage": {
            "prompt_tokens": len(call.prompt_ids),
            "completion_tokens": len(call.completion_ids),
            "total_tokens": len(call.prompt_ids) + len(call.completion_ids),
        },  # fmt: skip
        "token_ids": {"prompt_token_ids": call.prompt_ids, "completion_token_ids": call.completion_ids},
    }


def anthropic_request(body: dict) -> tuple[list[dict], dict]:
    """(the conversation as chat messages, the request's sampling fields as the OpenAI routes name them) of a
    Messages API body: `system` becomes a first system message, text blocks become text; a request the trainer
    could not replay (tools, images, streaming) is refused by name."""
    if not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool):
        raise EndpointError(400, "max_tokens: a positive integer is required", "invalid", "max_tokens")
    if body.get("tools") or body.get("tool_choice"):
        raise EndpointError(400, "tools are not served: write the tool loop in the agent", "unsupported", "tools")
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
        conversation.append({"role": m["role"], "content": _blocks(m.get("content"), f"messages[{i}].content")})
    stops = body.get("stop_sequences")
    sampling = {key: body.get(key) for key in ("max_tokens", "temperature", "top_p", "top_k", "stream")}
    return conversation, {**sampling, "stop": stops if stops else None}


def _blocks(content, where: str) -> str:
    """Anthropic content: a string or a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "".join(str(b.get("text", "")) for b in content)
    raise EndpointError(400, f"{where}: only text blocks are served", "unsupported", where)


def message_response(body: dict, stops: list[str], call: Call, tokenizer) -> dict:
    """Anthropic's Message object, with the engine's ids (`token_ids`, as the OpenAI routes add them)."""
    sampled = tokenizer.decode(call.completion_ids, skip_special_tokens=True)
    stop = next((s for s in stops if s in sampled), None)
    reason = "max_tokens" if call.finish_reason == "length" else "stop_sequence" if stop else "end_turn"
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or "policy",
        "content": [{"type": "text", "text": call.text}],
        "stop_reason": reason,
        "stop_sequence": stop,
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


def openai_stream(kind: str, body: dict, call: Call, first: dict, last: dict) -> StreamingResponse:
    """An OpenAI stream of a sampled completion: the text in one chunk, then the finish reason with the engine's
    ids (`token_ids`), the usage when `stream_options.include_usage` asks, then [DONE]."""
    prefix = "chatcmpl" if kind == "chat.completion.chunk" else "cmpl"
    head = {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
            "model": body.get("model") or "policy"}  # fmt: skip
    ids = {"prompt_token_ids": call.prompt_ids, "completion_token_ids": call.completion_ids}
    events = [
        (None, {**head, "choices": [{"index": 0, **first, "finish_reason": None, "logprobs": None}]}),
        (None, {**head, "choices": [{"index": 0, **last, "finish_reason": call.finish_reason, "logprobs": None}],
                "token_ids": ids}),
    ]  # fmt: skip
    if (body.get("stream_options") or {}).get("include_usage"):
        total = len(call.prompt_ids) + len(call.completion_ids)
        usage = {"prompt_tokens": len(call.prompt_ids), "completion_tokens": len(call.completion_ids),
                 "total_tokens": total}  # fmt: skip
        events.append((None, {**head, "choices": [], "usage": usage}))
    return sse([*events, (None, "[DONE]")])


def anthropic_stream(message: dict) -> StreamingResponse:
    """Anthropic's event stream of a sampled Message: start, one text block in one delta, the stop reason."""
    text, usage = message["content"][0]["text"], message["usage"]
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 0}}  # fmt: skip
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    block = {"type": "text", "text": ""}
    events = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": block},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": stop, "usage": {"output_tokens": usage["output_tokens"]}},
        {"type": "message_stop"},
    ]
    return sse([(e["type"], e) for e in events])  # each event is named by its type, as Anthropic's are
