"""What a run keeps of its rollouts (:mod:`sao_gym.rollout_store`), from the trainer's side.

:class:`RolloutRecorder` picks which rollouts of a batch the learner traces
(``logging.rollouts_per_step`` of them, at random, seeded by the step), and
after the step writes them, with the learner's per-token quantities, to the
run's ``train`` split; infrastructure failures (which never reach the
learner) are written as they are. :func:`record_episodes` writes an
evaluation's episodes to a split of their own.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sao_gym.rollout_store import RolloutWriter, rollout_record
from sao_gym.types import Rollout

logger = logging.getLogger(__name__)


class TokenText:
    """Each token's text (``tokenizer.decode([id])``), remembered per id."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._known: dict[int, str] = {}

    def __call__(self, ids: Sequence[int]) -> list[str] | None:
        """The text of each of ``ids`` (None without a tokenizer)."""
        if self.tokenizer is None:
            return None
        new = sorted({i for i in ids if i not in self._known})
        if new:
            texts = self.tokenizer.batch_decode([[i] for i in new])
            self._known.update(zip(new, texts, strict=True))
        return [self._known[i] for i in ids]


class RolloutRecorder:
    """Keeps a sample of each training step's rollouts, and every infrastructure failure.

    Args:
        writer: the run's ``train`` split.
        per_step: rollouts of each batch traced and kept (0: only failures).
        tokenizer: decodes each token's text for the viewer (None: ids only).
        seed: the run's seed; step ``s`` picks with ``Random(seed * 1_000_003 + s)``.

    """

    def __init__(self, writer: RolloutWriter, *, per_step: int, tokenizer: Any = None,
                 seed: int = 0):
        if per_step < 0:
            raise ValueError(f"per_step must be >= 0, got {per_step}")
        self.writer, self.per_step, self.seed = writer, per_step, seed
        self.text = TokenText(tokenizer)
        self.failed_writes = 0
        """Steps whose rollouts could not be written (a full disk): logged, training goes on."""

    def pick(self, step: int, batch: Sequence[Rollout]) -> list[int]:
        """Positions in ``batch`` (trained as learner step ``step``) to trace and keep."""
        k = min(self.per_step, len(batch))
        return sorted(random.Random(self.seed * 1_000_003 + step).sample(range(len(batch)), k))

    def record(self, step: int, batch: Sequence[Rollout], trace: Mapping[int, Mapping[str, Any]],
               failures: Iterable[Rollout] = ()) -> int:
        """Write the traced rollouts of learner step ``step`` and ``failures``; how many."""
        records = [rollout_record(batch[i], split=self.writer.split, step=step, learner=row,
                                  learner_step=step, token_text=self.text(batch[i].token_ids))
                   for i, row in sorted(trace.items())]
        records += [rollout_record(r, split=self.writer.split, step=step,
                                   token_text=self.text(r.token_ids)) for r in failures]
        try:
            self.writer.write_all(records)
        except OSError:  # the run goes on without them
            self.failed_writes += 1
            logger.exception("could not keep the rollouts of step %d", step)
            return 0
        return len(records)

    def close(self) -> None:
        """Close the split's open file."""
        self.writer.close()


def record_episodes(run_dir: str | Path, split: str, rollouts: Iterable[Rollout], *,
                    step: int | None = None, tokenizer: Any = None,
                    segment_bytes: int = 64 << 20, max_bytes: int | None = 1 << 30) -> int:
    """Write ``rollouts`` (an evaluation's) to ``run_dir``'s split ``split``; how many."""
    text = TokenText(tokenizer)
    with RolloutWriter(run_dir, split, segment_bytes=segment_bytes,
                       max_bytes=max_bytes) as writer:
        return len(writer.write_all(
            rollout_record(r, split=split, step=step, token_text=text(r.token_ids))
            for r in rollouts))
