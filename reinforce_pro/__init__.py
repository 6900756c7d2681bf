"""reinforce_pro: OpenRLHF-style distributed RL for LLMs with rollout/training-mismatch correction.

The pure-torch algorithm core lives in `reinforce_pro.algos`; see docs/architecture.md for the rest.
"""

from reinforce_pro.ray_env import keep_local_ray_on_loopback

# Before any module of the package can import ray (see ray_env.py for why the order matters).
keep_local_ray_on_loopback()

__version__ = "0.1.0"
