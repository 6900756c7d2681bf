"""Weight-sync time per backend (--vllm_sync_backend): the real policy actor and vLLM engine, one push of the
policy's weights into the engine through Ray's object store (safetensors bytes) and by gloo broadcast
(rollout/collective.py), for the toy model and a ~100M-parameter one; plus the same sync computed for
0.5B / 7B / 32B models at cited link rates (docs/scaling.md explains the arithmetic).

Runs on: CPU (Ray, vLLM's CPU build, DeepSpeed); the GPU rows are computed, not measured.
Takes:   ~4 minutes on 2 cores with the defaults (most of it starting the engines).

    python -m benchmarks.bench_weight_sync
    python -m benchmarks.bench_weight_sync --sizes toy --reps 3
    python -m benchmarks.bench_weight_sync --render FILE     # re-render table and plot from a JSON

Each size gets one policy rank (ZeRO-2, fp32) and one fp32 engine; both backends are set up side by side
and pushed alternately, `reps` times each after one warm-up push, and the median is reported. A push is the
trainer's whole `sync_weights`: gather (ZeRO-3 would gather layer by layer), cast, send, load into vLLM
(its own loader, which on CPU also repacks the weights), prefix-cache reset.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    PACKAGED_MODELS,
    bench_main,
    new_figure,
    save_figure,
)

ROOT = Path(__file__).resolve().parent.parent

SIZES = {
    "toy": {},  # the embedded default's model (build_tiny_model's defaults)
    "100m": {"hidden_size": 768, "num_layers": 14, "num_heads": 12, "num_kv_heads": 12, "intermediate_size": 2048},
    "smollm2": "smollm2-135m-instruct",  # the packaged model (models/packaged.py), W3's
}
BACKENDS = ("object_store", "gloo")

# Computed rows: parameter counts from the models' cards (Qwen2.5-0.5B / 7B / 32B), weights sent in bf16.
PROJECTED_MODELS = {"0.5B": 0.494e9, "7B": 7.62e9, "32B": 32.8e9}
# Link rates (bytes/s), line rate in one direction: a lower bound on the time. Sources in docs/scaling.md.
LINKS = {
    "nccl, NVLink 4 (H100 SXM, one node)": 450e9,  # 900 GB/s bidirectional per GPU (H100 datasheet)
    "nccl, InfiniBand NDR 400 Gb/s (across nodes)": 50e9,  # one ConnectX-7 port
    "gloo, 100 Gb/s Ethernet": 12.5e9,
}


def model_path(size: str, workdir: Path) -> str:
    """A tiny architecture built in `workdir`, or a packaged model prepared once in the recipes' directory."""
    from reinforce_pro.models.packaged import prepare
    from reinforce_pro.models.tiny import build_tiny_model

    if isinstance(SIZES[size], str):
        return str(prepare(SIZES[size], PACKAGED_MODELS / SIZES[size]))
    return str(build_tiny_model(workdir / size, seed=0, **SIZES[size]))


def measure(size: str, reps: int, bucket_mb: float, workdir: Path) -> dict:
    import ray

    from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine
    from reinforce_pro.trainer.rollout_stream import EngineGate
    from reinforce_pro.trainer.weight_sync import BroadcastSync, ObjectStoreSync
    from reinforce_pro.workers.configs import ForwardConfig, OptimConfig
    from reinforce_pro.workers.launcher import GroupSpec, create_group, make_placement_group
    from reinforce_pro.workers.policy import PolicyLossConfig, PolicyWorker

    model = model_path(size, workdir)
    spec = GroupSpec(f"bench_{size}", 1, 1)
    pg = make_placement_group(spec, use_gpu=False)
    opt = OptimConfig(learning_rate=1e-6, param_dtype="fp32", micro_batch_size=1, zero_stage=2)
    fwd = ForwardConfig("sdpa", micro_batch_size=1)
    policy = create_group(PolicyWorker, spec, pg, False, 1.0, lambda d: (model, opt, PolicyLossConfig(), d, 0, fwd))
    cfg = EngineConfig(model_path=model, dtype="float32", max_model_len=64, enforce_eager=True, seed=0)
    engine = ray.remote(VLLMEngine).options(num_cpus=1).remote(cfg)
    try:
        ray.get(engine.reset_prefix_cache.remote())  # started
        syncs = {
            "object_store": ObjectStoreSync(policy, [engine], "float32"),
            "gloo": BroadcastSync(policy, [engine], "float32", "gloo", bucket_mb),
        }
        manifest = syncs["gloo"].manifest
        gate, times = EngineGate(), {b: [] for b in BACKENDS}
        for rep in range(reps + 1):  # the first push of each is a warm-up
            for backend in BACKENDS:
                start = time.perf_counter()
                syncs[backend].push(rep, gate)
                if rep:
                    times[backend].append(time.perf_counter() - start)
        params = sum(i.numel for i in manifest)
        return {
            "size": size,
            "parameters": params,
            "bytes": sum(i.nbytes for i in manifest),
            "tensors": len(manifest),
            **{f"{b}_s": statistics.median(times[b]) for b in BACKENDS},
            **{f"{b}_all_s": times[b] for b in BACKENDS},
        }
    finally:
        for actor in [*policy, engine]:
            ray.kill(actor)
        ray.util.remove_placement_group(pg)


def projected(payload: dict) -> list[dict]:
    """Seconds per sync of each projected model over each link at line rate, and through the object store at
    the rate measured here for the largest measured model (which is no GPU figure: it says how the
    serialise-copy-load path scales)."""
    largest = max(payload["results"], key=lambda r: r["bytes"])
    store_rate = largest["bytes"] / largest["object_store_s"]
    rows = []
    for name, params in PROJECTED_MODELS.items():
        sent = 2 * params  # bf16
        times = {link: sent / rate for link, rate in LINKS.items()}
        times[f"object store at the measured {store_rate / 1e9:.2f} GB/s"] = sent / store_rate
        rows.append({"model": name, "gb": sent / 1e9, "seconds": times})
    return rows


def render(payload: dict, out_dir: Path) -> str:
    cfg = payload["config"]
    lines = [
        "| model | parameters | fp32 MB sent | tensors | object store s | gloo s | gloo speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        lines.append(
            f"| {r['size']} | {r['parameters'] / 1e6:.1f}M | {r['bytes'] / 2**20:.1f} | {r['tensors']} | "
            f"{r['object_store_s']:.3f} | {r['gloo_s']:.3f} | {r['object_store_s'] / r['gloo_s']:.2f}x |"
        )
    lines += [
        "",
        f"Measured: one push of the policy's weights into one vLLM engine (CPU build), median of {cfg['reps']} "
        f"after a warm-up, the two backends alternating; gloo buckets of {cfg['bucket_mb']:g} MB "
        f"({payload['machine'].get('cpu', '')}, {payload['machine'].get('cpu_count')} cores, commit "
        f"{payload['commit'][:12]}).",
        "",
    ]
    rows = projected(payload)
    links = list(rows[0]["seconds"])
    lines += ["| model (bf16) | GB per sync | " + " | ".join(links) + " |", "|---|---|" + "---|" * len(links)]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['gb']:.1f} | " + " | ".join(f"{row['seconds'][k]:.2f}" for k in links) + " |"
        )
    lines += [
        "",
        "Computed, not measured: seconds per sync = bytes / link rate in one direction (line rate, so a lower "
        "bound; a pipelined broadcast to many engines costs about one transfer). Sources and the memory side "
        "in docs/scaling.md.",
    ]
    text = "\n".join(lines) + "\n"
    (out_dir / "bench_weight_sync.md").write_text(text)
    _plot(payload, out_dir / "bench_weight_sync.png")
    return text


def _plot(payload: dict, path: Path) -> None:
    rows = payload["results"]
    x = range(len(rows))
    fig, ax = new_figure((6, 3.5))
    for offset, backend in ((-0.2, "object_store"), (0.2, "gloo")):
        ax.bar([i + offset for i in x], [r[f"{backend}_s"] for r in rows], 0.4, label=backend)
    ax.set_xticks(list(x), [f"{r['size']}\n{r['bytes'] / 2**20:.0f} MB" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("seconds per sync (log)")
    ax.set_title("Weight sync into one vLLM engine, CPU")
    save_figure(fig, ax, path)


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="toy,100m", help="comma-separated: " + ", ".join(SIZES))
    p.add_argument("--reps", type=int, default=5, help="timed pushes per backend")
    p.add_argument("--bucket_mb", type=float, default=256.0, help="gloo bucket size (--vllm_sync_bucket_mb)")


def measured(args) -> tuple[dict, list]:
    from reinforce_pro.workers.launcher import start_ray

    start_ray(logical_cpus=4)
    sizes = [s for s in args.sizes.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(size, args.reps, args.bucket_mb, Path(tmp)) for size in sizes]
    return {"sizes": sizes, "reps": args.reps, "bucket_mb": args.bucket_mb, "engine_dtype": "float32"}, results


def main(argv=None) -> int:
    return bench_main(argv, "bench_weight_sync", __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
