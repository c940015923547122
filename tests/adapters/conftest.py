"""Fixtures of the adapter tests: OpenEnv servers of our env ids, one per test module; the
scratch venv with Harbor."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def harbor_python() -> Path:
    """``bin/python`` of a scratch venv with harbor 0.25 (it needs Python >= 3.12)."""
    from tests.adapters.scratch_venv import ScratchVenvError, find_python, scratch_venv

    python = find_python((3, 12))
    if python is None:
        pytest.skip("harbor 0.25 needs Python >= 3.12: none on PATH or in pyenv")
    try:
        return scratch_venv("harbor", ["harbor==0.25.*"], python=python)
    except ScratchVenvError as e:
        pytest.fail(f"could not build the harbor venv:\n{e}")


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
