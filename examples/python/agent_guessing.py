"""A two-turn guessing game on the built-in arithmetic prompts (`--agent_func_path
examples/python/agent_guessing.py --agent_max_turns 2`).

The model answers "a+b="; if it is wrong the environment says whether the sum is higher or lower and the
model guesses once more. Reward: 1.0 right at the first guess, 0.5 at the second, 0.0 otherwise.
"""


class AgentInstance:
    def __init__(self):
        self.turn = 0

    async def reset(self, states: dict) -> dict:
        return {"observation": states["prompt"]}

    async def step(self, states: dict) -> dict:
        self.turn += 1
        guess, target = states["action_text"].strip(), int(str(states["label"]))
        correct = guess.isdigit() and int(guess) == target
        if correct or self.turn >= 2:
            reward = (1.0 if self.turn == 1 else 0.5) if correct else 0.0
            return {"rewards": reward, "scores": float(correct), "environment_feedback": "", "done": True}
        hint = "higher" if not guess.isdigit() or int(guess) < target else "lower"
        return {"rewards": 0.0, "scores": 0.0, "environment_feedback": f" {hint}; again: ", "done": False}
