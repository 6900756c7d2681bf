"""Search-R1's search agent of agent_search.py, written to the OpenAI SDK (`--agent_func_path` this file).

The same environment, tags, reward and settings as the AgentInstance version (its docstring lists them): each
turn the model writes `<search>query</search>` or `<answer>text</answer>` through `client.completions`; this
file hands the turn to the search environment (reinforce_pro.search.agent, which queries the retrieval service)
and appends its `<information>` block to the prompt of the next turn. The retrieval service is reached from
here, as an agent's own tool call; the trainer's endpoint sees only the model's requests. SEARCH_MAX_TURNS (4,
as the recipe's --agent_max_turns) bounds the turns.
"""

import os

import openai

from reinforce_pro.search.agent import search_agent_from_environment

MAX_TURNS = int(os.environ.get("SEARCH_MAX_TURNS", "4"))
Environment = search_agent_from_environment()


async def run_agent(client, prompt: str, label) -> dict:
    env, logs, reward = Environment(), {}, 0.0
    text = (await env.reset({"prompt": prompt, "label": label}))["observation"]
    for turn in range(MAX_TURNS):
        try:
            reply = await client.completions.create(model="policy", prompt=text)
        except openai.BadRequestError as e:
            if e.code != "context_length_exceeded":
                raise
            break  # the episode ran out of room (--max_len): no answer
        action = reply.choices[0].text
        out = await env.step({"observation_text": text, "action_text": action, "label": label, "turn": turn,
                              "sampling_params": None})  # fmt: skip
        reward += out["rewards"]
        for key, value in out["extra_logs"].items():  # summed over turns, as the AgentInstance runner logs them
            logs[key] = logs.get(key, 0.0) + value
        if out["done"]:
            return {"reward": reward, "scores": out["scores"], "extra_logs": logs}
        text += action + out["environment_feedback"]
    return {"reward": reward, "scores": 0.0, "extra_logs": logs}
