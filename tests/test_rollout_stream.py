"""The rollout producer of --async_train (trainer/rollout_stream.py), driven by a fake producer and trainer:
the staleness bound, ordering, the end of the stream, errors and shutdown."""

import threading
import time

import pytest

from reinforce_pro.trainer.rollout_stream import AdaptiveLag, AsyncRollouts, EngineGate, RolloutBatch, SyncRollouts


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


def test_a_waiting_sync_goes_in_between_two_chunks():
    """--partial_rollout: the producer, holding the engines for batch 1, lets a waiting weight sync in between
    chunks; the next chunk sees the new version."""
    gate, seen = EngineGate(version=0), []
    with gate.generating(1, max_lag=1):
        seen.append(gate.let_syncs_in())  # nobody waiting: carries on at once
        done = threading.Event()

        def sync():
            with gate.syncing(1):
                pass
            done.set()

        syncer = threading.Thread(target=sync)
        syncer.start()
        while not gate.syncs_waiting and not done.is_set():
            time.sleep(0.001)
        seen.append(gate.let_syncs_in())  # the sync runs inside this call
    syncer.join()
    assert seen == [0, 1] and done.is_set()


@pytest.mark.parametrize(
    "settled, calls",
    [
        pytest.param(None, [([2, 2], 2), ([4, 4], 2), ([6], 2)], id="a-call-a-chunk"),
        # synchronously only the first chunk has other weights: the rest of each response is one call
        pytest.param(1, [([2, 2], 2), ([4, 4], 4)], id="settled-after-the-first-chunk"),
    ],
)
def test_partial_rollout_tokens_keep_the_version_and_log_prob_that_sampled_them(settled, calls):
    from reinforce_pro.rollout.sampler import PartialRollout, RolloutConfig, Sampler
    from reinforce_pro.rollout.vllm_engine import Generation

    engine = {"version": 3, "calls": []}

    def fake_sample(prompt_ids, sampling=None, engines=None):
        """Each token's log-prob says which weights sampled it; row 0 stops after 3 tokens."""
        engine["calls"].append(([len(p) for p in prompt_ids], sampling["max_tokens"]))
        out = []
        for ids in prompt_ids:
            n = sampling["max_tokens"]
            done_so_far = len(ids) - 2  # prompts are 2 tokens
            stop = ids[0] == 0 and done_so_far + n >= 3
            n = 3 - done_so_far if stop else n
            out.append(Generation([7] * n, [-float(engine["version"])] * n, "stop" if stop else "length"))
        return out

    def between(chunk):  # a weight sync lands before the second chunk
        assert chunk == len(engine["calls"])
        if chunk == 1:
            engine["version"] = 4
        return engine["version"]

    sampler = Sampler(engines=None, tokenizer=None, cfg=RolloutConfig(max_new_tokens=6))
    sampler.sample = fake_sample
    partial = PartialRollout(chunk=2, between=between, settled=settled)
    generations, versions = sampler.sample_in_chunks([[0, 1], [5, 1]], partial)
    assert [len(g.token_ids) for g in generations] == [3, 6] and [g.finish_reason for g in generations] == [
        "stop",
        "length",
    ]
    assert versions == [[3, 3, 4], [3, 3, 4, 4, 4, 4]]  # two versions in one response
    assert [g.log_probs for g in generations] == [[-3.0, -3.0, -4.0], [-3.0, -3.0, -4.0, -4.0, -4.0, -4.0]]
    assert engine["calls"] == calls  # unfinished rows continue from prompt + tokens so far, (lengths, max_tokens)


@pytest.mark.parametrize(
    "values, lags",
    [
        pytest.param([0.001, 0.001, 0.001, 0.001], [2, 3, 4, 4], id="small-mismatch-grows-to-the-limit"),
        pytest.param([0.5, 0.5, 0.5], [0, 0, 0], id="large-mismatch-drops-to-0"),
        pytest.param([0.07, 0.07, 0.5, 0.01], [1, 1, 0, 1], id="dead-band-holds"),
    ],
)
def test_adaptive_lag_rule(values, lags):
    ctl = AdaptiveLag(limit=4, target=0.1, metric="is/token_masked_frac")
    assert [ctl.update({"is/token_masked_frac": v}) for v in values] == lags


def test_adaptive_lag_holds_through_a_step_without_the_metric():
    ctl = AdaptiveLag(limit=4, target=0.1)
    assert ctl.update({}) == 1 and ctl.update({"is/token_masked_frac": 0.0}) == 2


def test_adaptive_lag_refuses_bad_settings():
    with pytest.raises(ValueError, match="--async_lag_metric"):
        AdaptiveLag(4, 0.1, "policy/entropy")
    with pytest.raises(ValueError, match="--async_lag_target must be > 0"):
        AdaptiveLag(4, 0.0)


def test_the_producer_obeys_a_lag_that_moves_between_steps():
    """The trainer lowers the lag from 3 to 0 after step 4: later batches wait for the weights just trained."""
    gate = EngineGate()
    stream = AsyncRollouts(fake_producer(gate, last=14), 1, gate, 3)
    out, step = [], 0
    with stream:
        while (batch := stream.get()[0]) is not None:
            step += 1
            k, version = batch.samples
            out.append((step - 1) - version)
            time.sleep(0.01)
            if step == 4:
                stream.max_lag = 0
            with gate.syncing(step):
                pass
    assert max(out[:4]) == 3  # ran 3 versions ahead while allowed
    # batches already queued when the lag dropped keep their (bounded) staleness; from then on: 0
    assert out[-5:] == [0] * 5 and max(out) <= 3
