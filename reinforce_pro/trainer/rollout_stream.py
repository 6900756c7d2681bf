"""Where the trainer's rollout batches come from: produced inline (synchronous RL, the default) or by a
producer thread that runs ahead of the trainer (--async_train), with bounded staleness.

Versions. The policy's version is the number of optimizer steps it has taken; the engines' version is the
policy version they last received. Batch k is trained at step k by weights of version k - 1. Under
--async_train with queue size Q the producer may start batch k only once the engines hold version
>= k - 1 - Q, so every trained sample is at most Q versions stale (AReaL's max_head_offpolicyness;
OpenRLHF's --async_queue_size means the same bound). The producer holds the engines for the whole of a batch
(generation and scoring): a weight sync waits for the batch in flight, and every row of a batch carries one
version. With --partial_rollout the batch is sampled in chunks of tokens and a waiting sync goes in between
two chunks (`let_syncs_in`): the rest of each response continues under the new weights, every token keeps the
log-prob of the weights that sampled it (`Samples.token_version`), and a row's staleness is that of its
oldest token, so the bound still holds. Nothing generated is thrown away in either mode.

Resume. Each batch carries the prompt stream's state after it was taken (`source_state`); a checkpoint
stores that of the last *trained* batch, so batches that were queued but not trained when the run died are
regenerated from the same prompts after resume, and no prompt is trained twice or skipped.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from reinforce_pro.experience import Samples


@dataclass
class RolloutBatch:
    """One step's rollout, as the producer hands it to the trainer."""

    samples: Samples
    metrics: dict[str, float]  # produced while generating (dynamic filtering, self-play, agents)
    consumed: list[int]  # dataset indices of every prompt taken for this batch
    source_state: dict  # the prompt stream (and the source's state) after this batch was taken: the resume point
    busy: tuple[float, float] = (0.0, 0.0)  # perf_counter start / end of its production (set by the stream)
    gate_wait_s: float = 0.0  # how long the producer waited for fresh enough weights before starting it

    @property
    def generate_s(self) -> float:
        return self.busy[1] - self.busy[0]


# produce(batch_number) -> the batch, or None when the prompt stream has run out
Produce = Callable[[int], "RolloutBatch | None"]


class EngineGate:
    """The engines' weight version and the lock that keeps generation and weight syncs apart.

    `generating(k, max_lag)` is held by whoever generates batch k: it first waits until the engines hold
    version >= k - 1 - max_lag. `syncing(version)` is held by the trainer while it pushes new weights."""

    def __init__(self, version: int = 0):
        self.version = version
        self._cond = threading.Condition()
        self.closed = False
        # A weight sync waiting for the engines goes before the next batch: without this the producer, which
        # releases and retakes the lock in one breath, could make the trainer wait a whole extra batch.
        self.syncs_waiting = 0

    def generating(self, batch: int, max_lag: int | Callable[[], int]) -> _Generating:
        """max_lag: a number, or a function read each time the condition is checked (--async_lag_target
        moves it between steps; the producer waiting here sees the new bound at the next weight sync)."""
        lag = max_lag if callable(max_lag) else lambda: max_lag
        return _Generating(self, lambda: batch - 1 - lag())

    def syncing(self, version: int) -> _Syncing:
        return _Syncing(self, version)

    def let_syncs_in(self) -> int:
        """Called by the holder of `generating` between two chunks of a batch (--partial_rollout): a weight
        sync that is waiting goes in now (the wait releases the lock); returns the engines' version, under
        which the next chunk is sampled."""
        if self.syncs_waiting:
            self._cond.wait_for(lambda: not self.syncs_waiting or self.closed)
        return self.version

    def exclusive(self) -> threading.Condition:
        """Hold the engines without changing the version (evaluation between steps)."""
        return self._cond

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class _Generating:
    def __init__(self, gate: EngineGate, need: Callable[[], int]):
        self.gate, self.need, self.waited_s = gate, need, 0.0

    def __enter__(self) -> _Generating:
        start = time.perf_counter()
        self.gate._cond.acquire()
        gate = self.gate
        gate._cond.wait_for(lambda: (gate.version >= self.need() and not gate.syncs_waiting) or gate.closed)
        self.waited_s = time.perf_counter() - start
        return self

    def __exit__(self, *exc) -> None:
        self.gate._cond.release()


class _Syncing:
    def __init__(self, gate: EngineGate, version: int):
        self.gate, self.new_version = gate, version

    def __enter__(self) -> None:
        self.gate.syncs_waiting += 1  # read by the producer under the lock; only the trainer's thread writes it
        self.gate._cond.acquire()
        self.gate.syncs_waiting -= 1

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.gate.version = self.new_version
        self.gate._cond.notify_all()
        self.gate._cond.release()


class SyncRollouts:
    """Batches produced on demand in the trainer's thread: generate, then train (the default)."""

    def __init__(self, produce: Produce, first_batch: int):
        self.produce, self.next_batch = produce, first_batch

    def __enter__(self) -> SyncRollouts:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def get(self) -> tuple[RolloutBatch | None, float]:
        """(the next batch or None at the end, seconds the trainer waited for it)."""
        start = time.perf_counter()
        batch = self.produce(self.next_batch)
        end = time.perf_counter()
        self.next_batch += 1
        if batch is not None:
            batch.busy = (start, end)
        return batch, end - start

    def busy_seconds(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] during which a rollout was being produced alongside: never, when synchronous."""
        return 0.0


@dataclass
class _End:
    error: BaseException | None = None


@dataclass
class AsyncRollouts:
    """A producer thread runs `produce` for batch after batch, up to `max_lag` versions ahead of the trainer
    (see the module docstring); the trainer takes finished batches in order with `get`."""

    produce: Produce
    first_batch: int
    gate: EngineGate
    max_lag: int
    _queue: queue.Queue = field(default_factory=queue.Queue)  # bounded by the gate, at most max_lag + 1
    _stop: threading.Event = field(default_factory=threading.Event)
    _busy: list = field(default_factory=list)  # (start, end) perf_counter of each production, end None in flight

    def __enter__(self) -> AsyncRollouts:
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        """Stop the producer; a batch in flight is finished (a Ray call cannot be cancelled) and dropped."""
        self._stop.set()
        self.gate.close()
        self._thread.join()

    def get(self) -> tuple[RolloutBatch | None, float]:
        start = time.perf_counter()
        item = self._queue.get()
        waited = time.perf_counter() - start
        if isinstance(item, _End):
            if item.error is not None:
                raise item.error  # as if produced here: its traceback still shows the producer's frames
            return None, waited
        return item, waited

    def busy_seconds(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] during which the producer was producing a batch."""
        now = time.perf_counter()
        return sum(max(0.0, min(t1, end or now) - max(t0, start)) for start, end in list(self._busy))

    def _run(self) -> None:
        k = self.first_batch
        try:
            while not self._stop.is_set():
                with self.gate.generating(k, lambda: self.max_lag) as held:  # max_lag may move (AdaptiveLag)
                    if self._stop.is_set():
                        break
                    interval = [time.perf_counter(), None]
                    self._busy.append(interval)
                    batch = self.produce(k)
                    interval[1] = time.perf_counter()
                    del self._busy[:-8]  # the trainer asks about its last step only
                if batch is None:
                    break
                batch.busy, batch.gate_wait_s = tuple(interval), held.waited_s
                self._queue.put(batch)
                k += 1
        except Exception as e:  # handed to the trainer, which raises it in its own thread
            self._queue.put(_End(e))
            return
        self._queue.put(_End())


# --async_lag_metric choices: metrics of every step that grow with the rollout/training mismatch
LAG_METRICS = ("is/token_masked_frac", "rollout/logprob_abs_diff_mean")


@dataclass
class AdaptiveLag:
    """--async_lag_target: how far the producer may run ahead, moved by the measured mismatch.

    After each step the trainer reads `metric` (LAG_METRICS): above `target` the lag drops by one version
    (down to 0: the next batch waits for the weights just trained), below half the target it grows by one (up
    to `limit`, --async_queue_size); in between it stays, so one noisy step does not make it oscillate.
    Fixed-lag async RL (OpenRLHF's --async_queue_size, AReaL's max_head_offpolicyness, prime-rl, verl) picks
    the lag by hand; this one runs ahead while the mismatch is small and holds back when it grows."""

    limit: int
    target: float
    metric: str = LAG_METRICS[0]
    lag: int = 1

    def __post_init__(self) -> None:
        if self.metric not in LAG_METRICS:
            raise ValueError(f"--async_lag_metric must be one of {', '.join(LAG_METRICS)}, got {self.metric}")
        if not self.target > 0:
            raise ValueError(f"--async_lag_target must be > 0, got {self.target}")
        self.lag = min(self.lag, self.limit)

    def update(self, metrics: dict[str, float]) -> int:
        """The lag for the batches produced from now on, given this step's metrics (unchanged by a step that
        logged no such metric: --freezing_actor_steps trains no policy, so no is/* metric)."""
        value = metrics.get(self.metric)
        if value is None:
            return self.lag
        if value > self.target:
            self.lag = max(0, self.lag - 1)
        elif value < self.target / 2:
            self.lag = min(self.limit, self.lag + 1)
        return self.lag
