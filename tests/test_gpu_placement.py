"""One device per rank on GPU nodes, proven on simulated ones: Ray gives a CPU machine GPUs to schedule
(`num_gpus=` on a node) and each actor the CUDA_VISIBLE_DEVICES it would see on real hardware.

Each case parses a real command line and runs the run's own placement code, run/actors.py `build_groups` (and
`reward_function` for the reward model), with every worker class swapped for a probe: an actor that takes
the same resources, placement group and bundle as the real one but imports no model and never touches CUDA,
and reports its node and CUDA_VISIBLE_DEVICES (an engine told several devices for its tensor-parallel workers
reports those). Policy ranks must own one device each, colocated models must sit on their rank's device,
separate groups on devices of their own, each TP engine on tp devices of one node, and no device idle that
the layout meant to use. The cases of one cluster shape (nodes x GPUs per node) run one after the other in one
process with one Ray cluster, each releasing its actors and placement groups before the next is placed (as a run
does on a cluster that outlives it); a cluster of 8 simulated GPUs costs more to start than a case to place.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.e2e  # a Ray cluster per layout

PROBE = textwrap.dedent(
    """
    import json, os, sys
    from types import SimpleNamespace
    import reinforce_pro  # loopback settings before ray
    import ray
    import reinforce_pro.run.actors as actors
    import reinforce_pro.run.sources as sources
    from reinforce_pro.cli.flags_to_config import run_config
    from reinforce_pro.cli.train_ppo_ray import parse_args

    nodes, per_node, argvs = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    if nodes == 1:
        ray.init(address="local", num_cpus=4 * per_node, num_gpus=per_node, include_dashboard=False,
                 _node_ip_address="127.0.0.1", log_to_driver=False)
    else:
        from ray.cluster_utils import Cluster
        node = dict(num_cpus=4 * per_node, num_gpus=per_node, node_ip_address="127.0.0.1",
                    object_store_memory=100 * 2**20)
        cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
        for _ in range(nodes - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)

    ENGINE_DEVICES = actors.ENGINE_DEVICES_ENV  # a string: the probe's process imports nothing of the project

    class Probe:
        def __init__(self, *args, **kwargs):
            pass

        def where(self):  # an engine told several devices (tensor parallelism) would run its workers there
            devices = os.environ.get(ENGINE_DEVICES) or os.environ.get("CUDA_VISIBLE_DEVICES")
            return [ray.get_runtime_context().get_node_id(), devices]

    for worker in ("PolicyWorker", "ReferenceWorker", "CriticWorker", "VLLMEngine", "RewardModelWorker"):
        for module in (actors, sources):  # the groups' workers, and the reward model's
            if hasattr(module, worker):
                setattr(module, worker, Probe)
    for case, argv in enumerate(argvs):
        cfg = run_config(parse_args(["--pretrain", "m", "--advantage_estimator", "reinforce", *argv]))
        plan = SimpleNamespace(model_path="m", log_dir=None, reward_source="model:rm")
        run = actors.build_groups(cfg, plan, use_gpu=True)
        if cfg.needs_critic:
            sources.reward_function(cfg, plan, True, run)
        where = {k: ray.get([a.where.remote() for a in v]) for k, v in run.roles().items()}
        print(f"PLACED {case} " + json.dumps(where), flush=True)
        run.release()  # the next case is placed on the whole cluster again
    """
)


def place_all(nodes: int, per_node: int, argvs: list[list[str]]) -> list[dict[str, list[tuple[str, str]]]]:
    """Where every role's actors run, for each command line of `argvs` in turn, on one cluster of `nodes` nodes of
    `per_node` simulated GPUs."""
    done = subprocess.run([sys.executable, "-c", PROBE, str(nodes), str(per_node), json.dumps(argvs)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith("PLACED "):
            case, where = line[len("PLACED ") :].split(" ", 1)
            found[int(case)] = {role: [tuple(w) for w in ws] for role, ws in json.loads(where).items()}
    assert len(found) == len(argvs), (done.stdout + done.stderr)[-4000:]
    return [found[case] for case in range(len(argvs))]


def devices(where: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Every (node, device) a role's actors hold, an engine's TP devices one by one."""
    return [(node, d) for node, ds in where for d in ds.split(",")]


def group(role: str, nodes: int, per_node: int) -> list[str]:
    return [f"--{role}_num_nodes", str(nodes), f"--{role}_num_gpus_per_node", str(per_node)]


KL = ["--init_kl_coef", "0.01"]  # a reference model
# a critic and a reward model (without it the probe runs reinforce: no critic)
GAE = ["--advantage_estimator", "gae", "--critic_pretrain", "m", "--reward_pretrain", "rm"]


CASES = [
    pytest.param(1, 8, [*group("actor", 1, 8), *KL, "--colocate_all_models", "--vllm_num_engines", "8"],
                 id="1x8-hybrid-engine"),
    pytest.param(1, 8, [*group("actor", 1, 8), *KL, "--colocate_all_models", "--vllm_num_engines", "4",
                        "--vllm_tensor_parallel_size", "2"], id="1x8-hybrid-engine-tp2"),
    pytest.param(2, 4, [*group("actor", 2, 4), *KL, "--colocate_all_models", "--vllm_num_engines", "4",
                        "--vllm_tensor_parallel_size", "2"], id="2x4-hybrid-engine-tp2"),
    pytest.param(1, 4, [*group("actor", 1, 2), *KL, "--colocate_actor_ref", "--vllm_num_engines", "2"],
                 id="1x4-actor-ref"),
    pytest.param(1, 8, [*group("actor", 1, 4), *group("ref", 1, 2), *KL, "--vllm_num_engines", "1",
                        "--vllm_tensor_parallel_size", "2"], id="1x8-separate-tp2"),
    pytest.param(2, 4, [*group("actor", 2, 2), *group("ref", 1, 2), *KL, "--vllm_num_engines", "2"],
                 id="2x4-separate"),
    pytest.param(1, 8, [*group("actor", 1, 2), *group("ref", 1, 2), *group("critic", 1, 2), *KL, *GAE,
                        "--colocate_critic_reward", "--vllm_num_engines", "2"], id="1x8-critic-reward"),
    pytest.param(2, 4, [*group("actor", 2, 2), *group("critic", 1, 2), *KL, *GAE, "--colocate_actor_ref",
                        "--colocate_critic_reward", "--vllm_num_engines", "1", "--vllm_tensor_parallel_size",
                        "2"], id="2x4-actor-ref-critic-reward-tp2"),
]  # fmt: skip


@pytest.fixture(scope="module")
def placements():
    """`placements(nodes, per_node, argv)`: where the case's actors run. The first case of a cluster shape places
    every case of that shape (place_all); the others read what it found."""
    found: dict[tuple, dict] = {}

    def where(nodes: int, per_node: int, argv: list[str]) -> dict[str, list[tuple[str, str]]]:
        if (nodes, per_node, tuple(argv)) not in found:
            argvs = [c.values[2] for c in CASES if c.values[:2] == (nodes, per_node)]
            for each, placed in zip(argvs, place_all(nodes, per_node, argvs), strict=True):
                found[nodes, per_node, tuple(each)] = placed
        return found[nodes, per_node, tuple(argv)]

    return where


@pytest.mark.parametrize("nodes, per_node, argv", CASES)
def test_every_rank_owns_a_device_and_colocated_actors_share_it(placements, nodes, per_node, argv):
    where = placements(nodes, per_node, argv)
    policy = where["policy"]
    colocate_all, colocate_ref = "--colocate_all_models" in argv, "--colocate_actor_ref" in argv
    tp = int(argv[argv.index("--vllm_tensor_parallel_size") + 1]) if "--vllm_tensor_parallel_size" in argv else 1
    assert all("," not in device for _, device in policy)  # exactly one device each
    assert len(set(policy)) == len(policy)  # one (node, device) per policy rank: none shared
    if argv[argv.index("--actor_num_gpus_per_node") + 1] == str(per_node):  # whole nodes: one per --actor_num_nodes
        assert len({node for node, _ in policy}) == int(argv[argv.index("--actor_num_nodes") + 1])
    if colocate_all or colocate_ref:
        assert where["reference"] == policy  # each reference rank on its policy rank's device
    for i, (node, engine_devices) in enumerate(where.get("engines", [])):
        assert len(engine_devices.split(",")) == tp, where["engines"]  # one device per TP worker
        if colocate_all:  # engine i spans policy ranks i*tp .. i*tp + tp - 1: their node, their devices
            ranks = policy[i * tp : (i + 1) * tp]
            assert {node} == {n for n, _ in ranks} and engine_devices == ",".join(d for _, d in ranks), where
    if "critic" in where:  # the reward model (one, no ranks of its own) beside critic rank 0
        assert where["reward_model"] == where["critic"][:1]
    owners = {role: devices(w) for role, w in where.items() if role != "reward_model"}
    if colocate_all:
        del owners["engines"]
    if colocate_all or colocate_ref:
        del owners["reference"]
    held = [d for ds in owners.values() for d in ds]
    assert len(set(held)) == len(held), owners  # no device held by two groups that were not meant to share
    assert len(held) == nodes * per_node  # nothing idle: every layout here uses the whole cluster
