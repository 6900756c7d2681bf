"""Tool calling on the endpoint's routes (agents/openai_app.py): the tools a request declares, rendered into the
prompt; the tool calls of the sampled text, parsed out of it; and a conversation's tool turns, rendered so that a
framework's next request extends the ids the engine sampled.

One call format is read: JSON in tags, the one the chatml family writes (Qwen2.5, Qwen3, Hermes, and the
built-in tiny model's template):

    <tool_call>
    {"name": "add", "arguments": {"a": 1, "b": 2}}
    </tool_call>

A template that renders `tools` itself (Qwen's, the tiny model's) is given them, with assistant `tool_calls` and
`tool` messages as they are. A template that knows nothing of tools (SmolLM2's chatml) gets the same format
written around it: the tools in the system message, a call in the assistant's text, a tool's result as a user
turn in <tool_response> tags. A template that renders tools in another call format (Llama 3's, Mistral's) is
refused by name: there is no parser here for it.

Token-exactness: an assistant message whose tool calls this endpoint made (their ids are the session's) is
rendered as the text the engine sampled, not re-serialised from the parsed calls, so the next prompt extends the
sampled ids even where the model's JSON spacing differs from the template's.

A sampled call that does not parse (bad JSON, no name, a tool the request did not declare) leaves the whole text
as the message's content and is counted (`agent/tool_call_failures`), as vLLM's parsers leave it. The text is the
model's and so hostile: whatever it holds (a name that is a list, JSON nested thousands deep, NaN or 1e400 among
the arguments, thousands of tags never closed) is read in time linear in its length and ends as a call or as
content, never as an exception.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass

from reinforce_pro.agents.trajectory import Call

OPEN, CLOSE = "<tool_call>", "</tool_call>"
THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)
MAX_TOOLS = 128  # tools one request may declare
NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # OpenAI's rule for function names
MAX_DEPTH = 64  # how deep a call's JSON may nest (arguments nest a few levels)
# a JSON string, skipped whole (one never closed runs to the end: a match never fails, so no backtracking makes
# the scan quadratic), or a bracket
BRACKETS = re.compile(r'"(?:\\.|[^"\\])*(?:"|\\?\Z)|[\[\]{}]')


class ToolError(ValueError):
    """A request's tools, tool choice or tool turns that cannot be served; `param` names the field."""

    def __init__(self, message: str, param: str = "tools", code: str = "invalid"):
        super().__init__(message)
        self.param, self.code = param, code


@dataclass
class ToolRequest:
    """The tools of one request, as OpenAI's Chat Completions API declares them."""

    tools: list[dict]  # {"type": "function", "function": {"name", "description", "parameters"}}
    choice: str = "auto"  # "auto", "none", "required", or the name of the one function to call
    parallel: bool = True  # False: sampling stops after the first call

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    @property
    def parses(self) -> bool:
        """Whether the completion is read for calls (tool_choice "none": it is the model's text)."""
        return self.choice != "none"


def tool_request(body: dict) -> ToolRequest | None:
    """The request's tools, checked; None when it declares none (tool_choice alone is then refused, as OpenAI
    refuses it)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ToolError("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ToolError(f"tools must be a list of at most {MAX_TOOLS} function tools")
    checked = [_function_tool(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise ToolError("tools: two tools have the same name")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ToolError("parallel_tool_calls must be true or false", "parallel_tool_calls")
    return ToolRequest(checked, _choice(choice, set(names)), parallel)


def _function_tool(tool, i: int) -> dict:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
        raise ToolError(f"tools[{i}]: only function tools are served ({{'type': 'function', 'function': {{...}}}})")
    name, parameters = function.get("name"), function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(name, str) or not NAME.match(name):
        raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, '_', '.' or '-'")
    if not isinstance(parameters, dict):
        raise ToolError(f"tools[{i}].function.parameters must be a JSON schema object")
    description = function.get("description") or ""
    if not isinstance(description, str):
        raise ToolError(f"tools[{i}].function.description must be a string")
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _choice(choice, names: set[str]) -> str:
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        return choice
    name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    if isinstance(choice, dict) and choice.get("type") == "function" and name in names:
        return name
    raise ToolError("tool_choice must be auto, none, required or {'type': 'function', 'function': {'name': <a "
                    "declared tool>}}", "tool_choice")  # fmt: skip


# ---------------------------------------------------------------------------------------------- the template
@dataclass
class TemplateTools:
    """What a tokenizer's chat template does with tools: renders them itself (`native`), and the text a call
    starts with in it (`opener`: "<tool_call>" then a newline, or not)."""

    native: bool
    opener: str


def template_tools(tokenizer) -> TemplateTools:
    """Probed once per tokenizer by rendering a conversation with a declared tool, a call and its result."""
    known = getattr(tokenizer, "_reinforce_pro_tools", None)
    if known is not None:
        return known
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    probe = [{"type": "function", "function": {"name": "probe_tool_x", "description": "", "parameters": {}}}]
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [_as_template_call("c1", "probe_call_y", {})]},
        {"role": "tool", "tool_call_id": "c1", "content": "probe_result_z"},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, tools=probe, tokenize=False, add_generation_prompt=True)
        native = all(s in text for s in ("probe_tool_x", "probe_call_y", "probe_result_z"))
    except Exception:  # a template that refuses tool turns renders them our way
        native = False
    if native and OPEN not in template:
        raise ToolError("this model's chat template writes tool calls in a format no parser here reads (only "
                        f"{OPEN} JSON {CLOSE}, the chatml family's, is served)", code="unsupported")  # fmt: skip
    newline = not native or f"{OPEN}\\n" in template or f"{OPEN}\n" in template
    found = TemplateTools(native, OPEN + ("\n" if newline else ""))
    tokenizer._reinforce_pro_tools = found
    return found


def _as_template_call(call_id: str, name: str, arguments) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tools_system_text(tools: list[dict]) -> str:
    """The tools as a system message says them to a template that cannot (the chatml family's wording of its
    format, in our words)."""
    lines = "\n".join(json.dumps(t) for t in tools)
    return (
        "You can call the functions declared in <tools></tools> below.\n<tools>\n"
        f"{lines}\n</tools>\n\nTo call one, write its name and arguments as one JSON object in "
        '<tool_call></tool_call> tags:\n<tool_call>\n{"name": <function name>, "arguments": <arguments object>}'
        "\n</tool_call>"
    )


def call_text(name: str, arguments) -> str:
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"


# ---------------------------------------------------------------------------------------------- parsing
@dataclass
class Parsed:
    """A completion read for tool calls."""

    content: str | None  # the text outside the calls (None when only calls), or the whole text
    calls: list[dict]  # OpenAI tool_calls: {"id", "type": "function", "function": {"name", "arguments": str}}
    failed: bool = False  # it held a call that did not parse, so it is all content
    reasoning: str | None = None  # a leading <think> block, apart (templates with <think>)


def parse_completion(text: str, tools: ToolRequest | None, think: bool = False) -> Parsed:
    """The content, reasoning and tool calls of a sampled `text`."""
    reasoning = None
    if think and (m := THINK.match(text)):
        reasoning, text = m.group(1).strip(), text[m.end() :]
    if tools is None or not tools.parses or OPEN not in text:
        return Parsed(text, [], reasoning=reasoning)
    blocks, rest, unclosed = split_calls(text)
    calls = []
    for block in blocks:
        call = _read_call(block, tools.names)
        if call is None:
            return Parsed(text, [], failed=True, reasoning=reasoning)
        calls.append(call)
    rest = rest.strip()
    if not calls or unclosed:  # an opened call never closed: it is text
        return Parsed(text, [], failed=True, reasoning=reasoning)
    return Parsed(rest or None, calls, reasoning=reasoning)


def split_calls(text: str) -> tuple[list[str], str, bool]:
    """(the bodies of the text's <tool_call> blocks, the text outside them, whether a tag opens and never closes).
    One pass of str.find: a lazy regex over n unclosed tags scans to the end from each of them (quadratic: 1.5 s
    at 4,000 tags, on the loop that serves every session)."""
    blocks, outside, at = [], [], 0
    while (start := text.find(OPEN, at)) != -1:
        end = text.find(CLOSE, start + len(OPEN))
        if end == -1:
            return blocks, "".join(outside) + text[at:], True
        outside.append(text[at:start])
        blocks.append(text[start + len(OPEN) : end])
        at = end + len(CLOSE)
    return blocks, "".join(outside) + text[at:], False


def _read_call(block: str, names: set[str]) -> dict | None:
    obj = model_json(block)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in names:
        return None
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        arguments = model_json(arguments)
    if not isinstance(arguments, dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(arguments)}}  # fmt: skip


def model_json(text: str):
    """JSON a model wrote, or None where it is not JSON every client can read back: malformed, nested deeper than
    MAX_DEPTH (the decoder recurses per level: past the interpreter's recursion limit it raises, and a process
    that raised the limit could overflow its stack), or holding NaN, Infinity or a number that overflows to one
    (Python reads all three; a strict JSON encoder, Starlette's included, refuses to write them, so they would
    fail the reply)."""
    if _depth(text) > MAX_DEPTH:
        return None
    try:
        return json.loads(text, parse_constant=_not_finite, parse_float=_finite)
    except (ValueError, RecursionError):
        return None


def _depth(text: str) -> int:
    """How deep the text's brackets nest outside JSON strings, in one regex pass."""
    depth = deepest = 0
    for m in BRACKETS.finditer(text):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif m.group() in "]}":
            depth -= 1
    return deepest


def _not_finite(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"{literal} overflows")
    return value


def remember_calls(session, parsed: Parsed, sampled_text: str) -> None:
    """File the parsed calls' ids under the text the engine sampled, for rendering the history (`render`)."""
    trajectory = session.trajectory
    trajectory.tool_calls += len(parsed.calls)
    trajectory.tool_call_failures += int(parsed.failed)
    for call in parsed.calls:
        session.sampled_calls[call["id"]] = sampled_text


def finish_reason(call: Call, parsed: Parsed) -> str:
    return "tool_calls" if parsed.calls else call.finish_reason


# ---------------------------------------------------------------------------------------------- rendering
def render_chat(tokenizer, messages, tools: ToolRequest | None, sampled: dict[str, str],
                continue_last: bool = False, template_kwargs: dict | None = None) -> str:  # fmt: skip
    """The prompt text of an OpenAI-shaped conversation (roles, text, assistant `tool_calls`, `tool` results):
    with the assistant's generation prompt, or (`continue_last`) ending inside the last message. `sampled`: the
    session's call ids -> the text the engine sampled with them."""
    if not isinstance(messages, list) or not messages:
        raise ToolError("messages must be a non-empty list", "messages")
    shape = template_tools(tokenizer) if tools is not None or _has_tool_turns(messages) else None
    plain = conversation(messages, sampled, shape is not None and shape.native)
    if tools is not None and not shape.native:
        plain = _with_tools_system(plain, tools.tools)
    kwargs = {**(template_kwargs or {}), **({"tools": tools.tools} if tools is not None and shape.native else {})}
    try:
        if continue_last:
            return tokenizer.apply_chat_template(plain, tokenize=False, continue_final_message=True, **kwargs)
        return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True, **kwargs)
    except Exception as e:  # a template that refuses these messages (a role it does not know)
        raise ToolError(f"the chat template refused the messages: {e}", "messages") from None


def _has_tool_turns(messages: list) -> bool:
    return any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in messages)


def conversation(messages: list, sampled: dict[str, str], native: bool) -> list[dict]:
    """The messages as the chat template is given them (see render_chat)."""
    out: list[dict] = []
    called: set[str] = set()  # ids of the calls so far
    answered: set[str] = set()
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ToolError(f"messages[{i}] must be an object with a role", "messages")
        text = message_text(m.get("content"), f"messages[{i}].content")
        if m["role"] == "assistant" and m.get("tool_calls"):
            out.append(_assistant_calls(m["tool_calls"], text, i, called, sampled, native))
        elif m["role"] == "tool":
            out.append(_tool_result(m, text, i, called, answered, native, out))
        else:  # OpenAI's developer role is the system role of templates that know none (as the Responses route)
            out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": text})
    return [{k: v for k, v in m.items() if k != "tool_results"} for m in out if m is not None]


def _assistant_calls(tool_calls, text: str, i: int, called: set, sampled: dict, native: bool) -> dict:
    if not isinstance(tool_calls, list):
        raise ToolError(f"messages[{i}].tool_calls must be a list", "messages")
    calls = []
    for j, c in enumerate(tool_calls):
        function = c.get("function") if isinstance(c, dict) else None
        if not isinstance(function, dict) or not isinstance(c.get("id"), str) or not isinstance(
                function.get("name"), str):  # fmt: skip
            raise ToolError(f"messages[{i}].tool_calls[{j}] must have an id and a function name", "messages")
        if c["id"] in called:
            raise ToolError(f"messages[{i}].tool_calls[{j}]: the call id {c['id']!r} is used twice", "messages")
        called.add(c["id"])
        calls.append((c["id"], function["name"], _arguments(function.get("arguments"), f"messages[{i}]")))
    texts = {sampled.get(call_id) for call_id, _, _ in calls}
    if len(texts) == 1 and None not in texts:  # the calls this endpoint parsed: the text it sampled
        return {"role": "assistant", "content": texts.pop()}
    if native:
        return {"role": "assistant", "content": text, "tool_calls": [_as_template_call(*c) for c in calls]}
    written = "\n".join(call_text(name, arguments) for _, name, arguments in calls)
    return {"role": "assistant", "content": f"{text}\n{written}" if text else written}


def _arguments(arguments, where: str) -> dict:
    if isinstance(arguments, dict):
        return arguments
    parsed = model_json(arguments) if isinstance(arguments, str) else None  # a client echoes the model's JSON
    if not isinstance(parsed, dict):
        raise ToolError(f"{where}: a tool call's arguments must be a JSON object", "messages")
    return parsed


def _tool_result(m: dict, text: str, i: int, called: set, answered: set, native: bool, out: list) -> dict | None:
    call_id = m.get("tool_call_id")
    if call_id not in called or call_id in answered:
        raise ToolError(f"messages[{i}]: a tool message must answer a call of an earlier assistant message, once "
                        f"(tool_call_id {call_id!r})", "messages")  # fmt: skip
    answered.add(call_id)
    if native:
        return {"role": "tool", "tool_call_id": call_id, "content": text}
    wrapped = f"<tool_response>\n{text}\n</tool_response>"
    if out and out[-1].get("tool_results"):  # results of one turn's calls go in one user turn
        out[-1]["content"] += "\n" + wrapped
        return None
    return {"role": "user", "content": wrapped, "tool_results": True}


def _with_tools_system(plain: list[dict], tools: list[dict]) -> list[dict]:
    said = tools_system_text(tools)
    if plain and plain[0]["role"] == "system":
        return [{"role": "system", "content": f"{plain[0]['content']}\n\n{said}"}, *plain[1:]]
    return [{"role": "system", "content": said}, *plain]


def message_text(content, where: str) -> str:
    """A message's content as text: a string, or a list of text parts (OpenAI's, the Responses API's)."""
    if content is None or isinstance(content, str):
        return content or ""
    kinds = ("text", "input_text", "output_text")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in kinds for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise ToolError(f"{where}: only text is served", "messages", "unsupported")
