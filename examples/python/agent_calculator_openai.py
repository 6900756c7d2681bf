"""The calculator agent of agent_calculator.py, written to the OpenAI SDK (`--agent_func_path` this file).

The same task, tool and reward as the AgentInstance version: the prompt is "a+b="; each turn the model answers
(digits only) or writes `calc(x+y)`, and the tool's result " -> <x+y>; answer: " is appended to the prompt for
the next turn. Reward: 1.0 for a correct answer without the tool, 0.8 with it, 0.0 otherwise.

`client` is an `openai.AsyncOpenAI` pointed at this episode's session of the trainer's endpoint: every token the
model samples here is trained, exactly as sampled (docs/agents.md: agents written to the OpenAI SDK).
"""

import re

import openai

CALL = re.compile(r"calc\((\d+)\+(\d+)\)")
MAX_TURNS = 4  # as --agent_max_turns' default for the AgentInstance version


async def run_agent(client, prompt: str, label) -> dict:
    text, calls = prompt, 0
    for _ in range(MAX_TURNS):
        try:
            reply = await client.completions.create(model="policy", prompt=text)
        except openai.BadRequestError as e:
            if e.code != "context_length_exceeded":
                raise
            break  # the episode ran out of room (--max_len): no answer
        action = reply.choices[0].text.strip()
        if action.isdigit():  # an answer ends the episode
            correct = action == str(label).strip()
            reward = (1.0 if calls == 0 else 0.8) if correct else 0.0
            return {"reward": reward, "scores": float(correct), "extra_logs": {"tool_calls": float(calls)}}
        call = CALL.search(action)
        calls += 1
        result = int(call.group(1)) + int(call.group(2)) if call else "error"
        text += reply.choices[0].text + f" -> {result}; answer: "
    return {"reward": 0.0, "scores": 0.0, "extra_logs": {"tool_calls": float(calls)}}
