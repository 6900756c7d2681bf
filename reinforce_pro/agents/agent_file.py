"""What an `--agent_func_path` file holds: an `AgentInstance` class (agents/contract.py, OpenRLHF's contract) or an
agent written to the OpenAI SDK (agents/openai_agents.py: a `run_agent` function or OpenRLHF's executor class)."""

from __future__ import annotations

import inspect
from pathlib import Path

from reinforce_pro.agents.contract import AgentFileError, checked_instance_class
from reinforce_pro.agents.openai_agents import OpenAIAgent, load_openai_agent
from reinforce_pro.userfile import import_user_file

SHAPES = "class AgentInstance, async def run_agent(client, prompt, label), or an executor class with run_agent"


def load_agent(path: str | Path) -> type | OpenAIAgent:
    """The file's AgentInstance class, or its OpenAI-SDK agent; AgentFileError naming the file otherwise."""
    module = import_user_file(path, "--agent_func_path", AgentFileError, SHAPES)
    if inspect.isclass(getattr(module, "AgentInstance", None)):
        return checked_instance_class(module.AgentInstance, path)
    agent = load_openai_agent(module, str(path))
    if agent is None:
        raise AgentFileError(f"--agent_func_path {path}: defines none of: {SHAPES}")
    return agent
