"""Fixtures of the adapter tests: OpenEnv servers of our env ids, one per test module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def arithmetic():
    """``sao_gym/Arithmetic-v0`` served over OpenEnv (40 sessions at most)."""
    pytest.importorskip("openenv")
    from tests.adapters.openenv_helpers import ENV_ID, served

    with served(ENV_ID, max_concurrent_envs=40) as server:
        yield server


@pytest.fixture(scope="module")
def heavytail():
    """``sao_gym/HeavyTail-v0`` served over OpenEnv, with millisecond latencies."""
    pytest.importorskip("openenv")
    from tests.adapters.openenv_helpers import FAST_HEAVY, HEAVY, served

    with served(HEAVY, **FAST_HEAVY) as server:
        yield server
