"""The calculator agent with a function tool, written from the OpenAI SDK's function-calling guide
(`--agent_func_path` this file).

The task and reward of agent_calculator_openai.py (the text-protocol version): the prompt is "a+b="; the model
answers in digits, or calls the `add` tool, whose result comes back as a `tool` message. Reward: 1.0 for a
correct answer without the tool, 0.8 with it, 0.0 otherwise. Here the tool is declared with `tools=`: the chat
template renders it (the built-in model sees "tools: add(a, b)"), the endpoint parses the model's
<tool_call> text into `tool_calls`, and the history it renders next is what the model sampled
(docs/agents.md: tool calling).
"""

import json

import openai

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
MAX_TURNS = 4


def add(a, b) -> int:
    return int(a) + int(b)


async def run_agent(client, prompt: str, label) -> dict:
    messages, calls = [{"role": "user", "content": prompt}], 0
    for _ in range(MAX_TURNS):
        try:
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        except openai.BadRequestError as e:
            if e.code != "context_length_exceeded":
                raise
            break  # the episode ran out of room (--max_len): no answer
        message = reply.choices[0].message
        if not message.tool_calls:  # an answer ends the episode
            correct = (message.content or "").strip() == str(label).strip()
            reward = (1.0 if calls == 0 else 0.8) if correct else 0.0
            return {"reward": reward, "scores": float(correct), "extra_logs": {"tool_calls": float(calls)}}
        messages.append(message)
        for call in message.tool_calls:
            calls += 1
            try:
                result = str(add(**json.loads(call.function.arguments)))
            except (TypeError, ValueError) as e:  # arguments the tool cannot take: the model is told
                result = f"error: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return {"reward": 0.0, "scores": 0.0, "extra_logs": {"tool_calls": float(calls)}}
