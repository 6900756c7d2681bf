"""How the driver moves the policy's weights into the rollout engines (--vllm_sync_backend).

- `ObjectStoreSync` ("object_store"): rank 0 serialises the state dict as safetensors bytes, Ray's object
  store carries them to every engine (rollout/weight_receiver.py loads them). It can hold older versions, which
  --rollout_staleness needs, and switch the engines between two of them within a batch, which synchronous
  partial rollouts need (--partial_rollout with --rollout_staleness: `hold_for_chunk`).
- `BroadcastSync` ("gloo" | "nccl"): policy rank 0 and every engine worker form one process group at the
  start of the run and every sync is a bucketed broadcast (rollout/collective.py). Only the current weights.

Both are called between steps with the engines held (EngineGate in the trainer), and every policy rank takes
part (ZeRO-3 shards are gathered layer by layer on all ranks).
"""

from __future__ import annotations

import tempfile
import uuid
from collections import deque
from contextlib import contextmanager

import ray

from reinforce_pro.rollout.collective import WeightGroupSpec
from reinforce_pro.rollout.engine_wait import wait_for_engines
from reinforce_pro.workers.launcher import free_port, node_of


class ObjectStoreSync:
    def __init__(
        self, policy, engines, dtype: str, staleness: int = 0, partial: bool = False, engine_timeout_s: float = 0.0
    ):
        """partial: synchronous partial rollouts, whose responses start under the weights one version older
        than those `staleness` sets (see hold_for_chunk): one more version is kept. engine_timeout_s: an engine
        that has not loaded the weights by then is hung (rollout/engine_wait.py; 0: wait)."""
        self.policy, self.engines, self.dtype, self.timeout_s = policy, engines, dtype, engine_timeout_s
        self.staleness = staleness
        # (version, weights) in the object store, newest last; push loads the oldest kept: `staleness` old, or
        # `staleness` + 1 old with `partial`.
        self.versions: deque = deque(maxlen=staleness + 1 + int(partial))
        self.held: int | None = None  # the version the engines hold

    restores_engines = True  # a new engine can be given the weights the others hold (restore)

    def push(self, version: int, gate) -> None:
        """The current weights, or with staleness K those of K versions ago (the oldest kept until K exist).
        The policy serialises them while the engines may still be generating; the push waits for the batch
        in flight (`gate.syncing`). Pushed again (an engine was replaced mid-push), it loads what it kept."""
        if not self.versions or self.versions[-1][0] != version:
            refs = [p.state_dict_bytes.remote(self.dtype) for p in self.policy]
            ray.get(refs[1:])  # the other ranks take part in gathering ZeRO-3 shards
            self.versions.append((version, refs[0]))
        engine_version, blob = self.versions[0]
        with gate.syncing(engine_version):
            self._load(engine_version, blob)

    def hold_for_chunk(self, chunk: int) -> int:
        """Synchronous partial rollouts: the engines hold, for the first chunk of a call's responses, the
        version one older than the one --rollout_staleness K sets, and that one (K old) for every later chunk;
        returns the version that samples chunk `chunk` (0 = the first). Until K + 2 versions exist both are
        the oldest kept, as without partial rollouts. Called between chunks, with no generation in flight."""
        rest = max(0, len(self.versions) - 1 - self.staleness)
        version, blob = self.versions[rest if chunk > 0 else max(0, rest - 1)]
        if version != self.held:
            self._load(version, blob)
        return version

    @contextmanager
    def newest(self):
        """The engines hold the newest weights while the caller evaluates, then the older ones they sample
        with again: with staleness K an evaluation measures the policy trained so far, not the one K steps
        before. Called with the engines held (EngineGate.exclusive)."""
        if len(self.versions) < 2:
            yield
            return
        self._load(*self.versions[-1])
        try:
            yield
        finally:
            self._load(*self.versions[0])

    def restore(self, index: int) -> None:
        """A new engine `index` takes the weights the others hold (none pushed yet: the starting weights, which
        it loaded when it started)."""
        blob = next((b for v, b in self.versions if v == self.held), None)
        if blob is not None:
            engine = self.engines[index]
            wait_for_engines([engine.update_weights.remote(blob)], [(index, engine)], "weight sync", self.timeout_s)

    def _load(self, version: int, blob) -> None:
        refs = [engine.update_weights.remote(blob) for engine in self.engines]
        wait_for_engines(refs, list(enumerate(self.engines)), "weight sync", self.timeout_s)
        self.held = version


class BroadcastSync:
    # a new engine joins a group formed again; it gets the policy's current weights, which are the other engines'
    # only while the policy is not training at the same time (synchronous training: PPOTrainer checks)
    restores_engines = True

    def __init__(
        self, policy, engines, dtype: str, backend: str, bucket_mb: float, tensor_parallel_size: int = 1,
        engine_timeout_s: float = 0.0,
    ):  # fmt: skip
        """Form the group: policy rank 0 is rank 0, engine i's workers are ranks 1 + i * tp ... (the engines
        must run the same `tensor_parallel_size`)."""
        self.policy, self.engines, self.timeout_s = policy, engines, engine_timeout_s
        self.backend, self.tp = backend, tensor_parallel_size
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.manifest = ray.get([p.weight_manifest.remote(dtype) for p in policy])[0]
        self._form()

    def _form(self) -> None:
        """Every member joins a new group (each drops the one it held), on a new rendezvous."""
        store, host = rendezvous(self.policy[0], self.engines)
        spec = WeightGroupSpec(self.backend, store, 1 + len(self.engines) * self.tp)
        joins = [self.policy[0].join_weight_group.remote(spec, host)]
        joins += [e.join_weight_group.remote(spec, 1 + i * self.tp) for i, e in enumerate(self.engines)]
        ray.get(joins)

    def push(self, version: int, gate) -> None:
        with gate.syncing(version):
            self._broadcast()

    def restore(self, index: int) -> None:
        """A new engine `index`: the group is formed again (the old one lost a member) and the policy's weights
        broadcast to every engine."""
        self._form()
        self._broadcast()

    def _broadcast(self) -> None:
        refs = [p.broadcast_weights.remote(self.manifest, self.bucket_bytes) for p in self.policy]
        refs += [e.receive_weights.remote(self.manifest, self.bucket_bytes) for e in self.engines]
        wait_for_engines(refs, [None] * len(self.policy) + list(enumerate(self.engines)), "weight sync",
                         self.timeout_s)  # fmt: skip

    @contextmanager
    def newest(self):
        """The engines always hold the newest weights (a broadcast keeps no older ones)."""
        yield


def rendezvous(rank0, engines) -> tuple[str, str]:
    """(store, rank 0's address): a file store when every member reports the same node address (one host:
    no TCP listener), else a TCPStore on a free port of rank 0's node."""
    host = node_of(rank0)["ip"]
    if all(node_of(e)["ip"] == host for e in engines):
        return f"file://{tempfile.gettempdir()}/reinforce_pro_weights_{uuid.uuid4().hex}", host
    host, port = ray.get(rank0.__ray_call__.remote(lambda self: free_port()))
    return f"tcp://{host}:{port}", host


def make_weight_sync(
    backend: str, policy, engines, dtype: str, staleness: int, bucket_mb: float, tp: int = 1, partial: bool = False,
    engine_timeout_s: float = 0.0,
):  # fmt: skip
    """partial: synchronous partial rollouts (ObjectStoreSync.hold_for_chunk), which only the object store serves.
    engine_timeout_s: a sync an engine has not taken by then raises EngineHung (rollout/engine_wait.py)."""
    if backend == "object_store":
        return ObjectStoreSync(policy, engines, dtype, staleness, partial, engine_timeout_s)
    return BroadcastSync(policy, engines, dtype, backend, bucket_mb, tp, engine_timeout_s)
