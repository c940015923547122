"""Dealing micro-batches to ranks by token count (sao_gym.learner.engine.group.deal)."""

import pytest

from sao_gym.learner.engine.group import SINGLE, deal


def test_deal_balances_tokens_and_pads_every_rank_to_one_length():
    sizes = [100, 10, 60, 50, 40]
    shares = deal(sizes, 2)
    # longest first to the lightest rank: 100 -> r0, 60 -> r1, 50 -> r1, 40 -> r0, 10 -> r1
    assert shares == [[(0, 1.0), (4, 1.0), (0, 0.0)], [(1, 1.0), (2, 1.0), (3, 1.0)]]
    real = sorted(i for s in shares for i, w in s if w)
    assert real == list(range(len(sizes)))  # every item once, at weight 1
    assert len({len(s) for s in shares}) == 1  # as many passes on every rank


def test_more_ranks_than_items_and_one_rank():
    assert deal([5], 3) == [[(0, 1.0)], [(0, 0.0)], [(0, 0.0)]]
    assert deal([3, 1, 2], 1) == [[(0, 1.0), (1, 1.0), (2, 1.0)]]
    assert SINGLE.share([3, 1, 2]) == [(0, 1.0), (1, 1.0), (2, 1.0)]
    assert SINGLE.sum([1, 2]) == [1.0, 2.0] and SINGLE.union({3: "x"}) == {3: "x"}
    with pytest.raises(ValueError, match="ranks must be >= 1"):
        deal([1], 0)


def test_every_engine_of_the_one_table_builds():
    from sao_gym.learner.config import ENGINES, engine_builder
    from sao_gym.learner.engine import fsdp_engine, local_engine

    assert engine_builder("local") is local_engine and engine_builder("fsdp") is fsdp_engine
    for name in ENGINES:  # every row names a function that exists
        assert callable(engine_builder(name))
    with pytest.raises(KeyError):
        engine_builder("nope")


def test_engine_settings_that_cannot_work_are_refused():
    from sao_gym.learner.config import LearnerConfig

    with pytest.raises(ValueError, match="1 for engine local"):
        LearnerConfig(ranks=2)
    for bad in ({}, {"engine": "fsdp", "ranks": 2}):  # local engine; fsdp on the CPU
        with pytest.raises(ValueError, match="cpu_offload needs an engine that offloads"):
            LearnerConfig(cpu_offload=True, **bad)
    assert LearnerConfig(engine="fsdp", ranks=2, device="cuda", cpu_offload=True).cpu_offload
