"""OpenAI's Responses API (POST /v1/responses) on the endpoint: the wire format the OpenAI Agents SDK uses by
default. It is one more way to write the same chat conversation, so it is read into chat messages and served
by the chat route's rendering, sampling, recording and tool parsing (agents/openai_app.py, agents/tools.py).

Served: `input` (a string, or items: messages with text parts, `function_call`, `function_call_output`;
`reasoning` items are skipped, the template decides what the model saw of its thinking), `instructions`,
function `tools`, `tool_choice`, `parallel_tool_calls`, `max_output_tokens`, `stream`. The conversation state
lives with the client: `previous_response_id` is refused (the Agents SDK sends the whole input by default), and
`store` is accepted and ignored. Built-in tools (web search, file search, computer use) are refused by name.
"""

from __future__ import annotations

import time
import uuid

from reinforce_pro.agents.tools import Parsed, ToolError, message_text
from reinforce_pro.agents.trajectory import Call

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def chat_request(body: dict) -> tuple[list[dict], dict]:
    """(the conversation as chat messages, a Chat Completions body with the same sampling, tools and stream)
    of a Responses API body. Raises ToolError for what is not served."""
    if body.get("previous_response_id") is not None or body.get("conversation") is not None:
        raise ToolError("previous_response_id: responses are not stored here; send the whole conversation as "
                        "input", "previous_response_id", "unsupported")  # fmt: skip
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    structured = (text.get("format") or {}).get("type", "text") != "text"
    if structured or (body.get("reasoning") or {}).get("effort") not in (None, "none", "minimal"):
        raise ToolError("structured output and reasoning effort are not served: the policy samples plain text",
                        "text", "unsupported")  # fmt: skip
    messages = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": message_text(body["instructions"], "instructions")})
    messages += input_messages(body.get("input"))
    chat = {"messages": messages, "stream": body.get("stream")}
    for ours, theirs in (("max_tokens", "max_output_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                         ("parallel_tool_calls", "parallel_tool_calls"), ("tool_choice", "tool_choice")):  # fmt: skip
        if body.get(theirs) is not None:
            chat[ours] = body[theirs]
    if isinstance(chat.get("tool_choice"), dict) and chat["tool_choice"].get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": chat["tool_choice"].get("name")}}
    if body.get("tools"):
        chat["tools"] = [_function(t, i) for i, t in enumerate(body["tools"])] if isinstance(body["tools"], list) \
            else body["tools"]  # fmt: skip
    return messages, chat


def _function(tool, i: int) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise ToolError(f"tools[{i}]: only function tools are served, not {kind!r}", "tools", "unsupported")
    keys = ("name", "description", "parameters")
    return {"type": "function", "function": {k: tool[k] for k in keys if tool.get(k) is not None}}


def input_messages(items) -> list[dict]:
    """The Responses API's `input` as chat messages: a function call joins the assistant message before it (the
    order the API writes a turn's output items in), its output becomes a tool message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ToolError("input must be a string or a non-empty list of items", "input")
    messages: list[dict] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and ROLES.get(item.get("role")):
            messages.append({"role": ROLES[item["role"]], "content": message_text(item.get("content"), f"input[{i}]")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}  # fmt: skip
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                messages.append(last := {"role": "assistant", "content": ""})
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else message_text(output, f"input[{i}].output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind != "reasoning":
            raise ToolError(f"input[{i}]: items of type {kind!r} are not served (messages with text, "
                            "function_call, function_call_output)", "input", "unsupported")  # fmt: skip
    return messages


def response_object(body: dict, call: Call, parsed: Parsed) -> dict:
    """The Response: its output items (reasoning, message, function calls), with the engine's ids."""
    output = []
    if parsed.reasoning:
        output.append({"type": "reasoning", "id": f"rs_{uuid.uuid4().hex[:24]}",
                       "summary": [{"type": "summary_text", "text": parsed.reasoning}]})  # fmt: skip
    if parsed.content or not parsed.calls:
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "status": "completed",
                       "role": "assistant", "content": [{"type": "output_text", "text": parsed.content or "",
                                                         "annotations": [], "logprobs": []}]})  # fmt: skip
    output += [{"type": "function_call", "id": f"fc_{c['id'][5:]}", "call_id": c["id"], "name": c["function"]["name"],
                "arguments": c["function"]["arguments"], "status": "completed"} for c in parsed.calls]  # fmt: skip
    cut = call.finish_reason == "length" and not parsed.calls
    prompt, completion = len(call.prompt_ids), len(call.completion_ids)
    return {
        "id": f"resp_{uuid.uuid4().hex[:24]}", "object": "response", "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None, "model": body.get("model") or "policy", "instructions": body.get("instructions"),
        "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"), "previous_response_id": None, "store": False,
        "text": {"format": {"type": "text"}}, "truncation": "disabled", "metadata": {},
        "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": completion,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion},
        "token_ids": {"prompt_token_ids": call.prompt_ids, "completion_token_ids": call.completion_ids},
    }  # fmt: skip


def stream_events(response: dict) -> list[tuple[str, dict]]:
    """The Responses API's events for a sampled response: created, each output item added, filled in one delta
    and done, then completed (which carries the whole response, as the Agents SDK reads it)."""
    events = [{"type": "response.created", "response": {**response, "status": "in_progress", "output": []}}]
    for index, item in enumerate(response["output"]):
        events.append({"type": "response.output_item.added", "output_index": index, "item": _opened(item)})
        if item["type"] == "message":
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events += [
                {"type": "response.content_part.added", **where, "part": {**part, "text": ""}},
                {"type": "response.output_text.delta", **where, "delta": part["text"], "logprobs": []},
                {"type": "response.output_text.done", **where, "text": part["text"], "logprobs": []},
                {"type": "response.content_part.done", **where, "part": part},
            ]
        elif item["type"] == "function_call":
            where = {"item_id": item["id"], "output_index": index}
            events += [
                {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"],
                 "name": item["name"]},
            ]  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    return [(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events)]


def _opened(item: dict) -> dict:
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    if item["type"] == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    return item
