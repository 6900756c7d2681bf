"""A reward file for --remote_rm_url (OpenRLHF's reward_func contract): 1.0 when the last number in the
response equals the label (e.g. GSM8K-style answers), else 0.0; the format score says whether the
response contained a number at all."""

import re

import torch

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def reward_func(queries, prompts, labels):
    rewards, has_number = [], []
    for query, prompt, label in zip(queries, prompts, labels, strict=True):
        numbers = NUMBER.findall(query[len(prompt) :].replace(",", ""))
        has_number.append(float(bool(numbers)))
        rewards.append(float(bool(numbers) and float(numbers[-1]) == float(str(label).replace(",", ""))))
    r = torch.tensor(rewards)
    return {"rewards": r, "scores": r, "extra_logs": {"has_number": torch.tensor(has_number)}}
