"""The routes of the OpenAI-compatible endpoint (agents/openai_endpoint.py), as a FastAPI app.

Requests are read with a size cap and parsed here; the endpoint decides the sampling and records the call. Every
refusal is an OpenAI-style JSON error (the SDK raises BadRequestError, NotFoundError, ...), never a traceback.
"""

from __future__ import annotations

import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

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


def build_app(endpoint) -> FastAPI:
    """The routes of `endpoint` (an openai_endpoint.Endpoint: its sessions, sampling and batcher)."""
    app = FastAPI(title="reinforce_pro rollout endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(EndpointError)
    async def refused(request: Request, e: EndpointError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": endpoint.model_name, "sessions": len(endpoint.sessions)}

    async def models():
        return {"object": "list", "data": [{"id": endpoint.model_name, "object": "model", "created": 0,
                                            "owned_by": "reinforce_pro"}]}  # fmt: skip

    async def chat(request: Request, sid: str | None = None):
        body = await read_body(request)
        session = endpoint.session_for(sid, request.headers.get("x-session-id"), body)
        text = chat_prompt_text(endpoint.tokenizer, body.get("messages"))
        ids = endpoint.prompt_ids(session, text, with_bos=False)
        call = await endpoint.complete(session, text, ids, body, request.is_disconnected)
        message = {"role": "assistant", "content": call.text}
        return response("chat.completion", body, call, {"message": message}, endpoint.tokenizer)

    async def completions(request: Request, sid: str | None = None):
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
        return response("text_completion", body, call, {"text": call.text}, endpoint.tokenizer)

    for prefix in ("/v1", "/s/{sid}/v1"):
        app.add_api_route(f"{prefix}/models", models, methods=["GET"])
        app.add_api_route(f"{prefix}/chat/completions", chat, methods=["POST"])
        app.add_api_route(f"{prefix}/completions", completions, methods=["POST"])
    return app


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


def chat_prompt_text(tokenizer, messages) -> str:
    """The text the tokenizer's chat template gives `messages` (with the assistant's generation prompt)."""
    if not isinstance(messages, list) or not messages:
        raise EndpointError(400, "messages must be a non-empty list", "invalid", "messages")
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise EndpointError(400, f"messages[{i}] must be an object with a role", "invalid", "messages")
        plain.append({"role": m["role"], "content": _text(m.get("content"), i)})
    try:
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
