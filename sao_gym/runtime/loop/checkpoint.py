"""Atomic checkpoints of a training run.

A checkpoint is a directory ``RUN_DIR/checkpoints/step_NNNNNNN`` holding:

- ``learner/`` and ``learner_meta.pt``: the learner's state
  (:mod:`sao_gym.learner.state`: models and optimizers as a sharded
  ``torch.distributed.checkpoint``, resumable on any number of ranks;
  counters, algorithm state, RNG). Older checkpoints hold ``learner.pt``
  instead, still read;
- ``policy/``: the policy as a Hugging Face checkpoint (servable, evaluable);
- ``trainer.json``: the trainer's own state (step, data cursor, counters).

It is written into a temporary sibling directory, every file fsynced, then
renamed into place and the parent fsynced: a checkpoint directory either is
complete or does not exist, whenever the process dies (``kill -9`` included).
Leftover temporary directories are removed on the next save.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from sao_gym.utils.fs import fsync_path, fsync_tree

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^step_(\d{7})$")


class CheckpointManager:
    """Saves, finds and loads checkpoints under ``run_dir/checkpoints``."""

    def __init__(self, run_dir: str | os.PathLike[str], keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.dir = Path(run_dir) / "checkpoints"
        self.keep = keep

    def complete(self) -> list[tuple[int, Path]]:
        """Complete checkpoints as ``(step, path)``, oldest first."""
        if not self.dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.dir.iterdir()
                 if (m := _NAME.match(p.name)) and (p / "trainer.json").is_file()]
        return sorted(found)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or ``None``."""
        done = self.complete()
        return done[-1][1] if done else None

    def resume_point(self, seed: int) -> tuple[Path | None, int]:
        """``(latest checkpoint, its next task seed)``, or ``(None, seed)`` without one."""
        latest = self.latest()
        if latest is None:
            return None, seed
        state = json.loads((latest / "trainer.json").read_text())
        logger.info("resuming from %s (step %d)", latest, state["step"])
        return latest, int(state["next_seed"])

    def save(self, step: int, learner: Any, trainer_state: dict[str, Any], *,
             token: str | None = None) -> Path:
        """Write a checkpoint for ``step`` atomically; prune old ones; return its path.

        A learner on several ranks whose every rank calls this (a Ray learner
        group) passes the same ``token`` on each: they write their shards into
        one temporary directory, and rank 0 completes and renames it. A
        learner that mirrors its calls to its ranks itself is saved from rank
        0 alone.
        """
        lead = learner.group.rank == 0
        final = self.dir / f"step_{step:07d}"
        tmp = self.dir / f".tmp-step_{step:07d}-{token or os.getpid()}"
        tmp.mkdir(parents=True, exist_ok=True)
        if lead:
            for stale in self.dir.glob(".tmp-*"):
                if stale != tmp:
                    shutil.rmtree(stale, ignore_errors=True)
        learner.save_state(tmp)
        learner.save_policy(tmp / "policy")
        if not lead:
            return final
        (tmp / "trainer.json").write_text(json.dumps({"step": step, **trainer_state}))
        fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_path(self.dir)
        for _, old in self.complete()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        logger.info("checkpoint written: %s", final)
        return final

    @staticmethod
    def trainer_state(path: str | os.PathLike[str]) -> dict[str, Any]:
        """The trainer's state in checkpoint directory ``path``.

        The learner reads its own part with ``learner.load_state(path)``.
        """
        path = Path(path)
        if not (path / "trainer.json").is_file():
            raise FileNotFoundError(f"{path} is not a complete checkpoint")
        return json.loads((path / "trainer.json").read_text())
