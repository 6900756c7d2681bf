"""The calculator task as an OpenAI Agents SDK agent (`--agent_func_path` this file), written from the SDK's
quickstart: an `Agent` with one `function_tool`, run by `Runner.run`. Its default model class speaks the
Responses API, which the endpoint serves (POST /v1/responses); it is given the episode's client, so every request
lands in this episode's session and every token the model samples is trained (docs/agents.md). Reward: 1.0 for
the right answer, 0.0 otherwise.

Tracing is turned off: the SDK would otherwise send traces to OpenAI, and nothing here reaches the network.
Needs `openai-agents` (the `frameworks` extra).
"""

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded

set_tracing_disabled(True)


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def run_agent(client, prompt: str, label) -> dict:
    agent = Agent(name="calculator", instructions="Add with the add tool.", tools=[add],
                  model=OpenAIResponsesModel(model="policy", openai_client=client))  # fmt: skip
    try:
        result = await Runner.run(agent, prompt, max_turns=4)
    except MaxTurnsExceeded:
        return {"reward": 0.0, "scores": 0.0}
    correct = str(result.final_output).strip() == str(label).strip()
    return {"reward": float(correct), "scores": float(correct)}
