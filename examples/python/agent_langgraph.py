"""The calculator task as a LangGraph ReAct agent (`--agent_func_path` this file), written from LangGraph's docs:
`create_react_agent` with a `ChatOpenAI` model on the episode's session and one `add` tool. Reward: 1.0 for the
right answer, 0.0 otherwise.

`client` is the episode's `openai.AsyncOpenAI`; ChatOpenAI is given its base URL, so every request LangGraph
makes lands in this episode's session and every token the model samples is trained (docs/agents.md).
Needs `langgraph` and `langchain-openai` (the `frameworks` extra).
"""

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def run_agent(client, prompt: str, label) -> dict:
    model = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key="none", max_retries=0)
    agent = create_react_agent(model, [add])
    result = await agent.ainvoke({"messages": [("user", prompt)]}, {"recursion_limit": 8})
    answer = result["messages"][-1].content
    calls = sum(len(getattr(m, "tool_calls", None) or []) for m in result["messages"])
    correct = answer.strip() == str(label).strip()
    return {"reward": float(correct), "scores": float(correct), "extra_logs": {"tool_calls": float(calls)}}
