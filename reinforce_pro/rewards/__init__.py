"""Reward functions: OpenRLHF's `reward_func(queries, prompts, labels)` files and built-in verifiers."""
