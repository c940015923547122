"""Shared fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Qwen2 checkpoint (seed 0) with tokenizer, built once per session (~0.4 s)."""
    from sao_gym.models import tiny_model

    return tiny_model(tmp_path_factory.mktemp("tiny_model"))
