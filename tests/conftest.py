# Import the package before any test module imports ray: it puts Ray's loopback settings in the
# environment, which Ray reads at import time (reinforce_pro/ray_env.py).
import reinforce_pro  # noqa: F401
