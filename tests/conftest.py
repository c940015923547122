"""Shared fixtures."""

from __future__ import annotations

import os

import pytest

# The suite runs offline: nothing may try the network, even by accident.
for _key, _value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                     "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                     "HF_DATASETS_OFFLINE": "1",
                     # Ray on this machine only: every node and worker on 127.0.0.1
                     # (sao_gym.runtime.place.ray.cluster), whichever test imports ray first
                     "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}.items():
    os.environ.setdefault(_key, _value)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Qwen2 checkpoint (seed 0) with tokenizer, built once per session (~0.4 s)."""
    from sao_gym.models import tiny_model

    return tiny_model(tmp_path_factory.mktemp("tiny_model"))
