"""Reward function for prompt files written by `python -m reinforce_pro.data.reasoning_tasks` (labels are
reasoning-gym entries): the last number in the response is the answer, scored by reasoning-gym's verifier
for the entry's task. Use with `--label_key entry --remote_rm_url examples/python/reward_reasoning_gym.py`.

rewards = scores = the verifier's score (1.0 exact, partial credit where the task gives it);
extra_logs: `answered`, whether the response contained a number at all (format learning shows up here first).
"""

import re

import torch

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_VERIFIERS = {}


def extract_answer(response: str) -> str | None:
    numbers = NUMBER.findall(response.replace(",", ""))
    return numbers[-1] if numbers else None


def verifier(task: str):
    if task not in _VERIFIERS:
        import reasoning_gym

        _VERIFIERS[task] = reasoning_gym.get_score_answer_fn(task)
    return _VERIFIERS[task]


def reward_func(queries, prompts, labels):
    scores, answered = [], []
    for query, prompt, entry in zip(queries, prompts, labels, strict=True):
        answer = extract_answer(query[len(prompt) :])
        answered.append(float(answer is not None))
        task = entry["metadata"]["source_dataset"]
        scores.append(float(verifier(task)(answer, entry)) if answer is not None else 0.0)
    scores = torch.tensor(scores)
    return {"rewards": scores, "scores": scores, "extra_logs": {"answered": torch.tensor(answered)}}
