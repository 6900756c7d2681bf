"""Weight sync by collective broadcast (--vllm_sync_backend gloo|nccl): policy rank 0 and every worker of
every engine form one process group of their own, and rank 0 broadcasts the weights bucket by bucket.

The group is not torch.distributed's default group: the policy's default group is DeepSpeed's (its
data-parallel ranks) and vLLM's workers have their own. A `ProcessGroupGloo` / `ProcessGroupNCCL` built
directly on a store is a group that lives beside them, and the same code serves both backends: only the
class and the tensors' device differ. Rendezvous goes through a file when every member is on one host (no
TCP listener at all) and through a TCPStore on rank 0's node otherwise.

What travels: a manifest (name, shape, dtype of every tensor, in order) is sent once through Ray; then each
sync broadcasts flat buffers of up to `bucket_bytes`, and the receivers cut them back into named tensors,
which stream into vLLM's own loader one bucket at a time. Neither side ever holds the whole model twice.

This module must stay importable without Ray or the trainer: vLLM imports it in its workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch

BACKENDS = ("gloo", "nccl")
SYNC_BACKENDS = ("nccl", "gloo", "object_store")  # --vllm_sync_backend: the broadcasts, or Ray's object store


@dataclass(frozen=True)
class WeightGroupSpec:
    backend: str  # gloo | nccl
    store: str  # "file:///path" (one host) or "tcp://host:port" (rank 0's node)
    world_size: int  # 1 (policy rank 0) + every engine worker
    timeout_s: float = 600.0


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name: "float32", "bfloat16", ...

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


def open_group(spec: WeightGroupSpec, rank: int, host: str):
    """This process's member of the weight group (blocks until every member has joined). `host`: the address
    gloo binds its connections to (the node's own address; 127.0.0.1 on one host)."""
    timeout = timedelta(seconds=spec.timeout_s)
    if spec.store.startswith("file://"):
        store = torch.distributed.FileStore(spec.store[len("file://") :], spec.world_size)
    else:
        addr, port = spec.store[len("tcp://") :].rsplit(":", 1)
        store = torch.distributed.TCPStore(addr, int(port), spec.world_size, is_master=rank == 0, timeout=timeout)
    if spec.backend == "gloo":
        from torch.distributed import ProcessGroupGloo

        options = ProcessGroupGloo._Options()
        options._devices = [ProcessGroupGloo.create_device(hostname=host)]
        options._timeout = timeout
        return ProcessGroupGloo(store, rank, spec.world_size, options)
    if spec.backend == "nccl":
        from torch.distributed import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        return ProcessGroupNCCL(store, rank, spec.world_size, options)
    raise ValueError(f"weight-sync backend {spec.backend!r}: expected one of {BACKENDS}")


def device_for(backend: str) -> torch.device:
    """Where the broadcast buffers live: the current GPU for NCCL, host memory for gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def buckets(manifest: list[TensorInfo], bucket_bytes: int) -> list[list[TensorInfo]]:
    """Consecutive runs of the manifest of one dtype and at most `bucket_bytes` (a larger tensor alone)."""
    out: list[list[TensorInfo]] = []
    size = 0
    for info in manifest:
        if not out or info.dtype != out[-1][0].dtype or size + info.nbytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(info)
        size += info.nbytes
    return out


def _broadcast(group, flat: torch.Tensor) -> None:
    group.broadcast([flat], torch.distributed.BroadcastOptions()).wait()


def send(group, tensors: Iterable[tuple[str, torch.Tensor]], manifest: list[TensorInfo], bucket_bytes: int,
         device: torch.device) -> int:  # fmt: skip
    """Rank 0: broadcast `tensors` (in manifest order, any device; cast to the manifest's dtype) bucket by
    bucket. Returns the bytes sent."""
    stream = iter(tensors)
    sent = 0
    for bucket in buckets(manifest, bucket_bytes):
        flat = torch.empty(sum(i.numel for i in bucket), dtype=getattr(torch, bucket[0].dtype), device=device)
        offset = 0
        for info in bucket:
            name, tensor = next(stream)
            if name != info.name or tuple(tensor.shape) != info.shape:
                raise RuntimeError(f"weight sync: got {name} {tuple(tensor.shape)}, manifest says {info}")
            flat[offset : offset + info.numel].copy_(tensor.reshape(-1))
            offset += info.numel
        _broadcast(group, flat)
        sent += flat.numel() * flat.element_size()
    return sent


def receive(
    group, manifest: list[TensorInfo], bucket_bytes: int, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every other rank: the broadcast tensors, named, one bucket received at a time as they are consumed
    (a fresh buffer per bucket: a loader may keep views of what it was given)."""
    for bucket in buckets(manifest, bucket_bytes):
        flat = torch.empty(sum(i.numel for i in bucket), dtype=getattr(torch, bucket[0].dtype), device=device)
        _broadcast(group, flat)
        offset = 0
        for info in bucket:
            yield info.name, flat[offset : offset + info.numel].view(info.shape)
            offset += info.numel
