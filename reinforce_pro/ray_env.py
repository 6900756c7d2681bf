"""Keep a local Ray cluster on loopback.

Ray reads these variables when `ray` is *imported*, so they must be in the environment before that; the
package sets them on import (reinforce_pro/__init__.py), which is earlier than any module of the package
can import ray. Measured on Ray 2.60: set after `import ray`, the raylet, GCS and dashboard agent listen on
every interface; set before, all of them listen on 127.0.0.1 only.

Skipped when joining an existing cluster (RAY_ADDRESS set, e.g. under `ray job submit`): there the cluster's
own configuration decides, and loopback would cut the driver off from other nodes. Set
REINFORCE_PRO_RAY_LOOPBACK=0 to skip it explicitly. Only `setdefault`: a value the user set wins.
"""

from __future__ import annotations

import os

LOCAL_RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # the switch that binds a single-node cluster to loopback
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "1",
}


def keep_local_ray_on_loopback() -> None:
    if os.environ.get("RAY_ADDRESS") or os.environ.get("REINFORCE_PRO_RAY_LOOPBACK") == "0":
        return
    for key, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(key, value)
