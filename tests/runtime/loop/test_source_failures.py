"""When nothing works: RolloutsFailing from the source (infra failures) and the trainer
(batches with nothing to train), and ``without_empty_groups``."""

from __future__ import annotations

import asyncio
import random

import pytest

from sao_gym.inference.scripted import ScriptedBackend
from sao_gym.runtime.loop.source import RolloutsFailing, RolloutSource
from sao_gym.runtime.loop.trainer import Trainer, without_empty_groups
from sao_gym.types import Rollout, StopReason
from tests.runtime.fakes import FakeLearner, ListSink, failed_rollout


def rollout(seed: int, actions: int, group_id: int | None = None) -> Rollout:
    """A finished (not failed) rollout: a 2-token prompt, then ``actions`` sampled tokens."""
    n = 2 + actions
    return Rollout(list(range(1, n + 1)), [0, 0] + [1] * actions, [0.0] * n,
                   [-1, -1] + [0] * actions, 1.0, True, False, StopReason.TERMINATED, False,
                   [], "", f"t{seed}", seed, group_id=group_id)


async def _drain(source: RolloutSource, batches: int) -> list[list[Rollout]]:
    got = []
    for _ in range(batches):
        got.append(await asyncio.wait_for(source.next_batch(), 5))
        await source.step_done(source.version)
    return got


# ------------------------------------------------------------------ the source


async def test_always_failing_episodes_raise_rollouts_failing_after_the_limit():
    calls = []

    async def play(seed, sample_seed=0):
        calls.append(seed)
        return failed_rollout(seed)

    source = RolloutSource(play, batch_size=1, concurrency=1, max_staleness=1,
                           max_infra_retries=100, max_failures_in_a_row=5)
    source.start()
    try:
        with pytest.raises(RolloutsFailing, match="5 episodes in a row failed") as err:
            await asyncio.wait_for(source.next_batch(), 5)
        assert "env_error" in str(err.value)
        await asyncio.sleep(0.05)
        # it stopped playing: exactly the 5 failures, nothing retried after them
        assert len(calls) == 5 and source.counters.infra_failures == 5
        assert source.counters.delivered == 0
        # the source stays failed
        with pytest.raises(RolloutsFailing):
            await asyncio.wait_for(source.next_batch(), 5)
    finally:
        await source.stop()


async def test_episodes_that_raise_count_as_failures_too():
    async def play(seed, sample_seed=0):
        raise OSError("no sandbox")

    source = RolloutSource(play, batch_size=2, concurrency=4, max_staleness=2,
                           max_failures_in_a_row=6)
    source.start()
    try:
        with pytest.raises(RolloutsFailing, match="in a row failed .*raised"):
            await asyncio.wait_for(source.next_batch(), 5)
        assert source.counters.infra_failures >= 6
    finally:
        await source.stop()


async def test_the_default_limit_scales_with_concurrency():
    async def play(seed, sample_seed=0):
        return failed_rollout(seed)

    assert RolloutSource(play, batch_size=1, concurrency=1,
                         max_staleness=0).max_failures_in_a_row == 16
    assert RolloutSource(play, batch_size=1, concurrency=20,
                         max_staleness=0).max_failures_in_a_row == 40


@pytest.mark.parametrize("every, limit, fails", [(3, 3, False), (4, 3, True)])
async def test_one_success_in_between_resets_the_count(every, limit, fails):
    # call i succeeds when i % every == every - 1: (every - 1) failures in a row at most
    calls = []

    async def play(seed, sample_seed=0):
        i = len(calls)
        calls.append(seed)
        return rollout(seed, 1) if i % every == every - 1 else failed_rollout(seed)

    source = RolloutSource(play, batch_size=1, concurrency=1, max_staleness=1,
                           max_infra_retries=100, max_failures_in_a_row=limit)
    source.start()
    try:
        if fails:
            with pytest.raises(RolloutsFailing, match=f"{limit} episodes in a row"):
                await _drain(source, 4)
            assert source.counters.delivered == 0 and source.counters.infra_failures == limit
        else:
            batches = await _drain(source, 4)
            assert [len(b) for b in batches] == [1, 1, 1, 1]
            assert all(not r.infra_failure for b in batches for r in b)
            assert source.counters.infra_failures >= 8  # 2 per success
    finally:
        await source.stop()


# ------------------------------------------------------------------ without_empty_groups


def test_without_empty_groups_drops_the_whole_group_of_an_empty_rollout():
    a1, a2 = rollout(1, 2, group_id=1), rollout(1, 0, group_id=1)
    b1, b2 = rollout(2, 1, group_id=2), rollout(2, 3, group_id=2)
    c1 = rollout(3, 0, group_id=3)
    lone_ok, lone_empty = rollout(4, 2), rollout(5, 0)  # group_id None: each its own group
    batch = [a1, b1, lone_ok, a2, c1, b2, lone_empty]
    kept = without_empty_groups(batch)
    assert kept == [b1, lone_ok, b2]
    assert all(k is r for k, r in zip(kept, [b1, lone_ok, b2], strict=True))
    assert without_empty_groups([b1, b2]) == [b1, b2]
    assert without_empty_groups([a2, c1, lone_empty]) == []
    assert without_empty_groups([]) == []


def test_rollouts_without_a_group_are_judged_alone():
    x, y = rollout(1, 0), rollout(1, 2)  # same seed, no group id: not one group
    assert without_empty_groups([x, y]) == [y]


# ------------------------------------------------------------------ the trainer


def _trainer(play, *, batch_size: int, total_steps: int):
    backend = ScriptedBackend([])
    source = RolloutSource(play, batch_size=batch_size, concurrency=2, max_staleness=0)
    learner = FakeLearner(random.Random(0))
    sink = ListSink()
    trainer = Trainer(source=source, learner=learner, backend=backend, sink=sink,
                      checkpoints=None, total_steps=total_steps)
    return trainer, source, learner, sink, backend


async def test_a_trainer_whose_batches_are_all_empty_raises_after_three():
    async def play(seed, sample_seed=0):
        return rollout(seed, 0)

    trainer, source, learner, sink, backend = _trainer(play, batch_size=2, total_steps=10)
    with pytest.raises(RolloutsFailing, match="3 batches in a row had no action tokens"):
        await asyncio.wait_for(trainer.arun(), 10)
    assert learner.steps_done == 0 and learner.batches == []
    assert source.counters.delivered == 6  # three batches of 2, then it stopped
    assert sink.rows == [] and sink.closed
    assert backend.weight_updates == [] and backend._closed  # shut down in order anyway


async def test_empty_batches_in_between_do_not_stop_training():
    # seeds 0, 1 empty, 2 not, ...: two empty batches in a row at most
    async def play(seed, sample_seed=0):
        return rollout(seed, 0 if seed % 3 != 2 else 2)

    trainer, source, learner, sink, backend = _trainer(play, batch_size=1, total_steps=3)
    await asyncio.wait_for(trainer.arun(), 10)
    assert learner.steps_done == 3
    assert [[r.seed for r in b] for b in learner.batches] == [[2], [5], [8]]
    assert [step for step, _ in sink.rows] == [1, 2, 3]


async def test_a_mixed_batch_trains_on_the_rest_and_counts_the_untrainable():
    async def play(seed, sample_seed=0):
        return rollout(seed, 0 if seed % 2 else 3)

    trainer, source, learner, sink, backend = _trainer(play, batch_size=2, total_steps=2)
    await asyncio.wait_for(trainer.arun(), 10)
    assert [[r.seed for r in b] for b in learner.batches] == [[0], [2]]
    assert [row["rollout/untrainable"] for _, row in sink.rows] == [1.0, 1.0]
    # the rollout statistics still describe the whole batch
    assert [row["rollout/action_tokens_mean"] for _, row in sink.rows] == [1.5, 1.5]
