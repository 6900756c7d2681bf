"""The rollout producer of --async_train (trainer/rollout_stream.py), driven by a fake producer and trainer:
the staleness bound, ordering, the end of the stream, errors and shutdown."""

import time

import pytest

from reinforce_pro.trainer.rollout_stream import AsyncRollouts, EngineGate, RolloutBatch, SyncRollouts


def fake_producer(gate: EngineGate, last: int, seconds: float = 0.0, fail_at: int | None = None):
    """produce(k): a batch whose samples are (k, the engines' version); None after batch `last`."""

    def produce(k: int) -> RolloutBatch | None:
        if k == fail_at:
            raise ValueError(f"reward function failed on batch {k}")
        if k > last:
            return None
        time.sleep(seconds)
        return RolloutBatch(samples=(k, gate.version), metrics={}, consumed=[k], source_state={"k": k})

    return produce


def drive(stream, gate: EngineGate, train_s: float) -> list[tuple[int, int]]:
    """The trainer's loop: take a batch, 'train' for train_s, push version `step`. Returns (step, staleness)."""
    out, step = [], 0
    with stream:
        while True:
            batch, _ = stream.get()
            if batch is None:
                return out
            step += 1
            k, version = batch.samples
            assert k == step, "batches arrive in order"
            assert batch.busy[1] >= batch.busy[0] > 0  # the stream timed its production
            out.append((step, (step - 1) - version))
            time.sleep(train_s)
            with gate.syncing(step):
                pass


@pytest.mark.parametrize("queue_size", [1, 2, 3])
def test_staleness_never_exceeds_the_queue_size_and_reaches_it_when_generation_is_fast(queue_size):
    gate = EngineGate()
    stream = AsyncRollouts(fake_producer(gate, last=12), 1, gate, queue_size)
    staleness = [s for _, s in drive(stream, gate, train_s=0.01)]
    assert len(staleness) == 12
    assert max(staleness) == queue_size and min(staleness) >= 0
    assert staleness[: queue_size + 1] == list(range(queue_size + 1))  # batches 1..Q+1 all saw version 0


def test_slow_generation_keeps_staleness_below_the_bound():
    gate = EngineGate()
    stream = AsyncRollouts(fake_producer(gate, last=6, seconds=0.03), 1, gate, 2)
    staleness = [s for _, s in drive(stream, gate, train_s=0.0)]
    assert len(staleness) == 6 and max(staleness) <= 1  # the trainer waits; the producer never gets 2 ahead


def test_synchronous_stream_is_never_stale():
    gate = EngineGate()
    assert [s for _, s in drive(SyncRollouts(fake_producer(gate, last=4), 1), gate, 0.0)] == [0, 0, 0, 0]


def test_a_producer_error_is_raised_in_the_trainer():
    gate = EngineGate()
    stream = AsyncRollouts(fake_producer(gate, last=9, fail_at=3), 1, gate, 1)
    with pytest.raises(ValueError, match="reward function failed on batch 3"):
        drive(stream, gate, 0.0)


def test_leaving_early_stops_a_producer_waiting_for_weights():
    gate = EngineGate()
    stream = AsyncRollouts(fake_producer(gate, last=100), 1, gate, 1)
    with stream:
        batch, _ = stream.get()  # batch 1; batch 2 follows, batch 3 waits for version 1, which never comes
        time.sleep(0.05)
    assert not stream._thread.is_alive() and batch.samples[0] == 1
    assert stream._queue.qsize() <= 2  # batch 2 and the end marker: nothing past the bound was produced


def test_evaluation_holds_the_engines_off_the_producer():
    gate, produced = EngineGate(), []

    def produce(k):
        produced.append(k)
        return None if k > 2 else RolloutBatch(k, {}, [], {})

    stream = AsyncRollouts(produce, 1, gate, 1)
    with gate.exclusive():  # what PPOTrainer.evaluate holds
        stream.__enter__()
        time.sleep(0.05)
        assert produced == []  # the producer waits for the engines
    batch, _ = stream.get()
    stream.__exit__(None, None, None)
    assert batch.samples == 1 and produced[0] == 1


def test_busy_seconds_counts_only_the_overlap():
    stream = AsyncRollouts(lambda k: None, 1, EngineGate(), 1)
    stream._busy = [[1.0, 3.0], [4.0, 6.0]]
    assert stream.busy_seconds(2.0, 5.0) == pytest.approx(2.0)  # [2, 3] and [4, 5]
    assert stream.busy_seconds(6.5, 9.0) == 0.0
    assert SyncRollouts(lambda k: None, 1).busy_seconds(0.0, 10.0) == 0.0
