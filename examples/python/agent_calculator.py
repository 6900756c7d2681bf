"""A calculator tool for the built-in arithmetic task (`--agent_func_path examples/python/agent_calculator.py`).

The prompt is "a+b=". Each turn the model either answers (digits only) or calls the calculator by writing
`calc(x+y)`; the environment answers a call with " -> <x+y>; answer: " (the calculator's result) and lets
the model act again, up to --agent_max_turns turns. Reward: 1.0 for a correct answer without the tool,
0.8 with it (a tool call costs), 0.0 for a wrong answer or none.
"""

import re

CALL = re.compile(r"calc\((\d+)\+(\d+)\)")


class AgentInstance:
    def __init__(self):
        self.calls = 0

    async def reset(self, states: dict) -> dict:
        return {"observation": states["prompt"]}

    async def step(self, states: dict) -> dict:
        action = states["action_text"].strip()
        label = str(states["label"]).strip()
        if action.isdigit():  # an answer ends the episode
            correct = action == label
            reward = (1.0 if self.calls == 0 else 0.8) if correct else 0.0
            return {"rewards": reward, "scores": float(correct), "environment_feedback": "", "done": True,
                    "extra_logs": {"tool_calls": float(self.calls)}}  # fmt: skip
        call = CALL.search(action)
        self.calls += 1
        feedback = f" -> {int(call.group(1)) + int(call.group(2))}; answer: " if call else " -> error; answer: "
        return {"rewards": 0.0, "scores": 0.0, "environment_feedback": feedback, "done": False,
                "extra_logs": {"tool_calls": float(self.calls)}}  # fmt: skip
