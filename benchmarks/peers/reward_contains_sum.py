"""bench_peers.py's reward for train_ppo_ray (OpenRLHF's reward_func contract): 1.0 when the correct sum
appears in the response, else 0.0. TRL's side applies the same rule (benchmarks/peers/trl_grpo.py)."""

import torch


def reward_func(queries, prompts, labels):
    responses = [q[len(p) :] for q, p in zip(queries, prompts, strict=True)]
    return torch.tensor([1.0 if str(label) in r else 0.0 for r, label in zip(responses, labels, strict=True)])
