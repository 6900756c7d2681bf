"""Starting Ray and placing the actor groups.

Each group (policy, reference, critic) gets a Ray placement group.
- With GPUs: one bundle per rank, {GPU: 1, CPU: 1}, PACKed (a node's GPUs fill before the next node's, as in
  OpenRLHF). Rank r runs in bundle r, so it owns one device; colocated actors (`--colocate_actor_ref`,
  `--colocate_critic_reward`, `--colocate_all_models`) take fractions (SHARES) of the *same bundle index*,
  so reference rank r shares policy rank r's GPU. One bundle of several GPUs would not do: Ray packs
  fractional requests inside it onto devices of its own choosing (measured on a simulated 8-GPU node: two
  policy ranks per GPU and no reference rank beside its policy rank; tests/test_gpu_placement.py).
- Without GPUs: one bundle per node of `per_node` logical CPUs; with several nodes the bundles are
  STRICT_SPREAD, so `--actor_num_nodes 2` really is two nodes (tests/test_multinode.py). Rank r runs in
  bundle r // per_node. Ray's CPU count is a scheduling token, not a core: on a 2-core machine the local
  cluster declares as many as the bundles need. That is safe in the synchronous pipeline (the engine
  generates, then the policy trains; they do not compete for the cores); under --async_train they do, and
  each actor is given its share of the cores as a thread count (run/actors.py: cpu_threads).
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import uuid
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from reinforce_pro.workers.configs import DistInfo
from reinforce_pro.workers.group import ActorGroup


def start_ray(logical_cpus: int, quiet: bool = False) -> None:
    """Join the cluster in RAY_ADDRESS (ray job submit sets it) or start a local one on 127.0.0.1 (the
    loopback settings were put in the environment when the package was imported: reinforce_pro/ray_env.py).
    `quiet`: Ray's own INFO lines ("Started a local Ray instance", "Connecting to existing Ray cluster") stay
    off the console; its warnings and errors do not."""
    if ray.is_initialized():
        return
    level = logging.WARNING if quiet else logging.INFO
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True, logging_level=level)
        return
    # address="local": always a new cluster. Without it ray.init() joins whatever `ray start` last wrote
    # to /tmp/ray/ray_current_cluster, and fails (or joins a stranger's cluster) when that file is stale.
    ray.init(
        address="local",
        num_cpus=max(logical_cpus, os.cpu_count() or 1),
        num_gpus=None,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=True,
        logging_level=level,
    )


def gpus_available() -> bool:
    return ray.cluster_resources().get("GPU", 0) > 0


@dataclass
class GroupSpec:
    name: str
    num_nodes: int
    per_node: int

    @property
    def size(self) -> int:
        return self.num_nodes * self.per_node


@dataclass(frozen=True)
class Shares:
    """The fraction of one bundle (a GPU, or a CPU slot) each actor takes; actors sharing a bundle sum to 1."""

    alone: float = 1.0
    pair: float = 0.5  # --colocate_actor_ref: policy + reference; --colocate_critic_reward: critic + reward model
    all_policy: float = 0.4  # --colocate_all_models: policy + reference + engine on one device
    all_reference: float = 0.3
    all_engine: float = 0.3


SHARES = Shares()
PLACEMENT_TIMEOUT_S = 300  # a request the cluster can never satisfy fails with a message instead of hanging


class PlacementFailed(RuntimeError):
    """A group's placement group was not placed in PLACEMENT_TIMEOUT_S (too few nodes or slots: a node lost, a
    layout larger than the cluster)."""


def make_placement_group(spec: GroupSpec, use_gpu: bool) -> PlacementGroup:
    """One bundle per rank with GPUs (PACK), one per node without (see the module docstring)."""
    if use_gpu:
        bundles, strategy = [{"GPU": 1, "CPU": 1} for _ in range(spec.size)], "PACK"
    else:
        bundles = [{"CPU": spec.per_node} for _ in range(spec.num_nodes)]
        strategy = "STRICT_SPREAD" if spec.num_nodes > 1 else "PACK"
    pg = placement_group(bundles, strategy=strategy, name=f"rp_{spec.name}")
    try:
        ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(pg)
        raise PlacementFailed(
            f"{spec.name}: {len(bundles)} bundle(s) of {bundles[0]} ({strategy}) could not be placed in "
            f"{PLACEMENT_TIMEOUT_S} s; the cluster has {ray.cluster_resources()} on {len(ray.nodes())} node(s)"
        ) from None
    return pg


def bundle_of(pg: PlacementGroup, spec: GroupSpec, rank: int) -> int:
    """The bundle of `pg` that rank `rank` of `spec` runs in: its own (one per rank) or its node's."""
    return rank * len(pg.bundle_specs) // spec.size


def node_of(actor) -> dict:
    """Where an actor runs: {"node_id", "ip", "placement_group", "devices", "pid"} (asked of the actor itself;
    devices: the GPUs it uses, CUDA_VISIBLE_DEVICES as it sees it, None without GPUs; pid: its process)."""
    return ray.get(actor.__ray_call__.remote(lambda self: _here()))


def _here() -> dict:
    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "placement_group": ctx.get_placement_group_id(),
        "devices": os.environ.get("CUDA_VISIBLE_DEVICES") or None,  # a TP engine has set all of its own
        "pid": os.getpid(),
    }


def free_port() -> tuple[str, int]:
    """(this node's address, a port free on it): run where the listener will be."""
    addr = ray.util.get_node_ip_address()  # 127.0.0.1 on the local cluster started by start_ray
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return addr, s.getsockname()[1]


def master_address(pg: PlacementGroup) -> tuple[str, int]:
    """(address, free port) on the node holding bundle 0: where rank 0 of the group will listen."""
    return ray.get(_on_bundle(pg, 0, free_port))


def _on_bundle(pg: PlacementGroup, bundle: int, fn):
    strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)
    return ray.remote(num_cpus=0)(fn).options(scheduling_strategy=strategy).remote()


def one_host(pg: PlacementGroup) -> bool:
    """Whether every bundle of `pg` is on a node with the same address (one machine, e.g. a simulated
    multi-node cluster): then the group can rendezvous through a file instead of a TCP listener."""
    ips = ray.get([_on_bundle(pg, b, ray.util.get_node_ip_address) for b in range(len(pg.bundle_specs))])
    return len(set(ips)) == 1


def env_options(env: dict | None) -> dict:
    """Ray actor options that give the actor's process these environment variables (none: {})."""
    return {"runtime_env": {"env_vars": env}} if env else {}


def create_group(
    cls, spec: GroupSpec, pg: PlacementGroup, use_gpu: bool, share: float, make_args, env: dict | None = None,
    ring: int = 1,
) -> ActorGroup:  # fmt: skip
    """One actor per rank, rank r in bundle r // per_node of `pg`; `make_args(dist)` gives the constructor
    arguments of each rank. `share` is the fraction of a GPU / CPU slot each actor takes (1.0, or less when
    colocated); `env`: environment variables of the actors' processes; `ring`: --ring_attn_size (ActorGroup)."""
    addr, port = master_address(pg)
    # One host: rendezvous through a file, so no rank opens a TCP listener on every interface.
    store = f"file://{tempfile.gettempdir()}/reinforce_pro_store_{uuid.uuid4().hex}" if one_host(pg) else None
    actor_cls = ray.remote(cls)
    actors = []
    for rank in range(spec.size):
        dist = DistInfo(rank=rank, world_size=spec.size, master_addr=addr, master_port=port, init_method=store)
        bundle = bundle_of(pg, spec, rank)
        strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)
        options = dict(num_cpus=share, num_gpus=share if use_gpu else 0, scheduling_strategy=strategy)
        actors.append(actor_cls.options(**options, **env_options(env)).remote(*make_args(dist)))
    return ActorGroup(actors, ring)
