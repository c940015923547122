"""A learner's state on disk: sharded with ``torch.distributed.checkpoint``, any number of ranks.

:func:`save_state` writes, into a checkpoint directory,

- ``learner/``: the models' and optimizers' tensors as a
  ``torch.distributed.checkpoint`` (DCP) checkpoint; every rank writes its
  own shards in parallel, none gathers the whole model;
- ``learner_meta.pt``: counters, the algorithm's state and the RNG states
  (small; written by rank 0).

:func:`load_state` reads it back into a learner on any number of ranks
(DCP reshards: written by 2 FSDP ranks, read by 1 device or by 4 ranks),
and also reads ``learner.pt``, the single file that checkpoints held before.
:func:`read_state` gives a checkpoint's whole state in memory (the form of
:meth:`Learner.state_dict <sao_gym.learner.learner.Learner.state_dict>`), for
tools and tests that compare tensors.

Every rank calls :func:`save_state` and :func:`load_state` together, with
the same path (a directory all of them see).
"""

from __future__ import annotations

import random
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

TENSORS = "learner"
"""Subdirectory of a checkpoint holding the DCP checkpoint."""
META = "learner_meta.pt"
"""File of a checkpoint holding counters, the algorithm's state and RNG states."""
LEGACY = "learner.pt"
"""The single-file learner state of older checkpoints (still read)."""

MODELS = ("policy", "critic")


def counters(learner: Any) -> dict[str, Any]:
    """Everything but tensors of models and optimizers: counters, algorithm state, RNG."""
    return {
        "algorithm": learner.algorithm,
        "steps_done": learner.steps_done,
        "policy_version": learner.policy_version,
        "skipped_steps": learner.skipped_steps,
        "baseline": learner.state.state_dict() if learner.state is not None else None,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                "numpy": np.random.get_state()},
    }


def check_algorithm(learner: Any, state: dict[str, Any]) -> None:
    """Refuse a state written by a learner of another algorithm."""
    if state["algorithm"] != learner.algorithm:
        raise ValueError(f"checkpoint is for {state['algorithm']!r}, not {learner.algorithm!r}")


def restore_counters(learner: Any, state: dict[str, Any]) -> None:
    """Apply :func:`counters` (checking the algorithm)."""
    check_algorithm(learner, state)
    if learner.state is not None:
        learner.state.load_state_dict(state["baseline"])
    # "step": the name of steps_done in checkpoints written before the rename
    learner.steps_done = state["steps_done"] if "steps_done" in state else state["step"]
    learner.policy_version = state["policy_version"]
    learner.skipped_steps = state["skipped_steps"]
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])


@contextmanager
def _one_process_quiet() -> Iterator[None]:
    """Without DCP's warning that a save or load with ``no_dist`` is one process's (it is meant)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is .*single process")
        yield


def _engines(learner: Any) -> dict[str, Any]:
    engines = {"policy": learner.policy_engine, "critic": learner.critic_engine}
    return {name: e for name, e in engines.items() if e is not None}


def save_state(learner: Any, path: str | Path) -> None:
    """Write ``learner``'s state into the checkpoint directory ``path`` (module docs)."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    shards = {name: e.checkpoint_state() for name, e in _engines(learner).items()}
    with _one_process_quiet():
        dcp.save(shards, checkpoint_id=path / TENSORS, no_dist=learner.group.size == 1)
    if learner.group.rank == 0:
        torch.save({**counters(learner), "ranks": learner.group.size,
                    "models": sorted(shards)}, path / META)


def load_state(learner: Any, path: str | Path) -> None:
    """Restore ``learner`` from the checkpoint directory ``path``, whatever ranks wrote it."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    if not (path / META).is_file():
        if (path / LEGACY).is_file():
            learner.load_state_dict(torch.load(path / LEGACY, weights_only=False))
            return
        raise FileNotFoundError(f"{path} holds no learner state ({META} or {LEGACY})")
    meta = torch.load(path / META, weights_only=False)
    check_algorithm(learner, meta)
    engines = _engines(learner)
    if sorted(engines) != meta["models"]:
        raise ValueError(f"checkpoint {path} holds models {meta['models']}, this learner "
                         f"trains {sorted(engines)}")
    shards = {name: e.checkpoint_state() for name, e in engines.items()}
    with _one_process_quiet():
        dcp.load(shards, checkpoint_id=path / TENSORS, no_dist=learner.group.size == 1)
    for name, e in engines.items():
        e.load_checkpoint_state(shards[name])
    restore_counters(learner, meta)


def read_state(path: str | Path) -> dict[str, Any]:
    """A checkpoint's whole learner state in memory, as :meth:`Learner.state_dict` gives it.

    Reads either format; tensors are whole (gathered from every shard).
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = Path(path)
    if not (path / META).is_file():
        return torch.load(path / LEGACY, weights_only=False)
    meta = torch.load(path / META, weights_only=False)
    with tempfile.TemporaryDirectory() as tmp:
        with _one_process_quiet():
            dcp_to_torch_save(path / TENSORS, Path(tmp) / "whole.pt")
        whole = torch.load(Path(tmp) / "whole.pt", weights_only=False)
    state = {k: v for k, v in meta.items() if k not in ("ranks", "models")}
    for name in MODELS:
        part = whole.get(name, {})
        state[name] = part.get("model")
        optimizer = part.get("optimizer")
        if optimizer is not None and not part["optimizer_started"]:  # never stepped
            optimizer = {"state": {}, "param_groups": optimizer["param_groups"]}
        state[f"{name}_opt"] = optimizer
    return state


__all__ = ["LEGACY", "META", "TENSORS", "check_algorithm", "counters", "load_state", "read_state",
           "restore_counters", "save_state"]
