"""reinforce_pro: OpenRLHF-style distributed RL for LLMs with rollout/training-mismatch correction.

The pure-torch algorithm core lives in `reinforce_pro.algos`; see docs/architecture.md for the rest.
"""

__version__ = "0.1.0"
