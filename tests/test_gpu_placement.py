"""One device per rank on GPU nodes, proven on simulated ones: Ray gives a CPU machine GPUs to schedule
(`num_gpus=` on a node) and each actor the CUDA_VISIBLE_DEVICES it would see on real hardware. The placement
functions of workers/launcher.py and cli/wiring.py place probe actors with the shares a real run uses; every
policy rank must own a device and its colocated reference rank / engine must share that device (issue 26).
Each case runs in its own process, with its own Ray cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray")

PROBE = textwrap.dedent(
    """
    import json, os, sys
    import reinforce_pro  # loopback settings before ray
    import ray
    from reinforce_pro.cli.config import run_config
    from reinforce_pro.cli.train_ppo_ray import parse_args
    from reinforce_pro.cli.wiring import engine_options, policy_devices
    from reinforce_pro.workers.launcher import SHARES, GroupSpec, create_group, make_placement_group

    nodes, per_node, colocate = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
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

    class Probe:
        def __init__(self, *args):
            pass

        def where(self):  # an engine told several devices (tensor parallelism) would run its workers there
            devices = os.environ.get("REINFORCE_PRO_ENGINE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES")
            return [ray.get_runtime_context().get_node_id(), devices]

    spec = GroupSpec("actor", nodes, per_node)
    pg = make_placement_group(spec, use_gpu=True)
    out = {}
    if colocate.startswith("all"):
        tp = 2 if colocate == "all-tp2" else 1
        argv = ["--colocate_all_models", "--actor_num_nodes", str(nodes), "--actor_num_gpus_per_node",
                str(per_node), "--vllm_num_engines", str(spec.size // tp), "--vllm_tensor_parallel_size", str(tp),
                "--pretrain", "m"]
        cfg = run_config(parse_args(argv))
        out["policy"] = create_group(Probe, spec, pg, True, SHARES.all_policy, lambda d: (d,))
        out["reference"] = create_group(Probe, spec, pg, True, SHARES.all_reference, lambda d: (d,))
        engine, devices = ray.remote(Probe), policy_devices(out["policy"])
        out["engine"] = [engine.options(**engine_options(cfg, True, pg, i, None, devices)).remote()
                         for i in range(spec.size // tp)]
    else:
        out["policy"] = create_group(Probe, spec, pg, True, SHARES.pair, lambda d: (d,))
        out["reference"] = create_group(Probe, spec, pg, True, SHARES.pair, lambda d: (d,))
    print("PLACED " + json.dumps({k: ray.get([a.where.remote() for a in v]) for k, v in out.items()}))
    """
)


def placed(nodes: int, per_node: int, colocate: str) -> dict[str, list[tuple[str, str]]]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(nodes), str(per_node), colocate],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith("PLACED ")), None)
    assert line is not None, (done.stdout + done.stderr)[-4000:]
    return {role: [tuple(w) for w in where] for role, where in json.loads(line[len("PLACED ") :]).items()}


@pytest.mark.parametrize(
    "nodes, per_node, colocate",
    [
        pytest.param(1, 8, "all", id="1x8-hybrid-engine"),
        pytest.param(1, 4, "actor_ref", id="1x4-actor-ref"),
        pytest.param(2, 4, "all", id="2x4-hybrid-engine"),
        pytest.param(1, 8, "all-tp2", id="1x8-hybrid-engine-tp2"),
    ],
)
def test_every_rank_owns_a_device_and_colocated_actors_share_it(nodes, per_node, colocate):
    where = placed(nodes, per_node, colocate)
    policy = where["policy"]
    assert len(set(policy)) == nodes * per_node, policy  # one (node, device) per policy rank: none shared
    assert all(device is not None and "," not in device for _, device in policy)  # exactly one device each
    assert len({node for node, _ in policy}) == nodes
    for rank, device in enumerate(policy):
        assert where["reference"][rank] == device, (rank, where)
        if colocate == "all":
            assert where["engine"][rank] == device, (rank, where)
    if colocate == "all-tp2":  # engine i spans policy ranks 2i and 2i + 1: their node, both their devices
        for i, (node, devices) in enumerate(where["engine"]):
            assert node == policy[2 * i][0] == policy[2 * i + 1][0]
            assert devices == f"{policy[2 * i][1]},{policy[2 * i + 1][1]}", (i, where)
