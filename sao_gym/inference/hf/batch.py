"""The running decode batch of :class:`~sao_gym.inference.hf.backend.HFBackend`.

A :class:`DecodeBatch` holds, for the rows currently being decoded: a
transformers ``DynamicCache`` (left-padded), the 2D attention mask over the
cached positions, each row's next position id, and the logits of each row's
next token. It supports the four operations continuous batching needs:

- :meth:`DecodeBatch.prefill`: encode new sequences (left padding, explicit
  position ids, logits of the last position only);
- :meth:`DecodeBatch.merge`: append another batch (the shorter cache is
  left-padded with masked zeros so both have the same length);
- :meth:`DecodeBatch.select`: keep some rows (finished rows leave the batch at
  once) and trim leading columns that are padding in every remaining row;
- :meth:`DecodeBatch.step`: feed one token per row and get the next logits;

and, for KV reuse across the turns of an episode
(:mod:`~sao_gym.inference.hf.sessions`), :meth:`DecodeBatch.row_cache` (one
row's KV, unpadded) and :meth:`DecodeBatch.resume` (a new row that encodes
only the tokens after such a cached prefix).

Rows are opaque objects carried along (the backend's requests), so the batch
knows nothing about sampling. Only models whose cache layers are plain
``DynamicLayer`` (full attention everywhere) are supported: sliding-window
layers keep a rolling cache that cannot be padded or merged this way.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class ModelRunner:
    """Calls a causal LM with the right keyword names for the installed transformers.

    transformers 5.x renamed ``past_key_values`` to ``cache`` (the old name is
    deprecated); ``logits_to_keep`` exists on most but not all models.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        params = inspect.signature(model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.has_logits_to_keep = "logits_to_keep" in params
        self.config = model.config

    def new_cache(self) -> DynamicCache:
        """An empty cache; refuses models with non-full-attention layers."""
        cache = DynamicCache(config=self.config)
        if any(type(layer) is not DynamicLayer for layer in cache.layers):
            kinds = sorted({type(layer).__name__ for layer in cache.layers})
            raise ValueError(
                f"HFBackend supports full-attention models only; cache layers: {kinds}"
            )
        return cache

    def __call__(
        self,
        input_ids_BT: torch.Tensor,
        mask_BL: torch.Tensor,
        position_ids_BT: torch.Tensor,
        cache: DynamicCache,
    ) -> torch.Tensor:
        """Run the model, extend ``cache`` in place and return last-position logits ``[B, V]``."""
        kwargs: dict[str, Any] = {self.cache_kwarg: cache}
        if self.has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(
            input_ids=input_ids_BT,
            attention_mask=mask_BL,
            position_ids=position_ids_BT,
            use_cache=True,
            **kwargs,
        )
        return out.logits[:, -1, :]


def _pad_left(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """Prepend ``n`` zeros (False for bool) along ``dim``."""
    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class DecodeBatch:
    """Rows being decoded together, with their shared left-padded KV cache."""

    def __init__(
        self,
        rows: list[Any],
        cache: DynamicCache,
        mask_BL: torch.Tensor,
        next_pos_B: torch.Tensor,
        logits_BV: torch.Tensor,
    ) -> None:
        self.rows = rows
        self.cache = cache
        self.mask_BL = mask_BL
        self.next_pos_B = next_pos_B
        self.logits_BV = logits_BV

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def cache_len(self) -> int:
        """Number of cached positions (columns of the mask)."""
        return self.mask_BL.shape[1]

    @classmethod
    def prefill(
        cls,
        runner: ModelRunner,
        seqs: Sequence[Sequence[int]],
        rows: list[Any],
        *,
        device: torch.device | str = "cpu",
        max_tokens: int = 16384,
    ) -> DecodeBatch:
        """Encode ``seqs`` (one per row) into a new batch; logits are for each row's next token.

        Sequences are processed in chunks of at most ``max_tokens`` padded
        tokens (after sorting by length, to waste little padding), then merged.
        """
        if len(seqs) != len(rows) or not seqs:
            raise ValueError("prefill needs one non-empty sequence per row")
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        batch: DecodeBatch | None = None
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and len(seqs[order[end]]) * (end + 1 - start) <= max_tokens:
                end += 1
            idx = order[start:end]
            part = cls._prefill_chunk(
                runner, [seqs[i] for i in idx], [rows[i] for i in idx], device
            )
            if batch is None:
                batch = part
            else:
                batch.merge(part)
            start = end
        assert batch is not None
        return batch

    @classmethod
    def _prefill_chunk(
        cls, runner: ModelRunner, seqs: list[Sequence[int]], rows: list[Any], device: Any
    ) -> DecodeBatch:
        """Prefill one chunk with left padding in a single forward pass."""
        width = max(len(s) for s in seqs)
        ids_BT = torch.zeros(len(seqs), width, dtype=torch.long)
        mask_BT = torch.zeros(len(seqs), width, dtype=torch.bool)
        for b, s in enumerate(seqs):
            ids_BT[b, width - len(s) :] = torch.as_tensor(list(s), dtype=torch.long)
            mask_BT[b, width - len(s) :] = True
        ids_BT, mask_BT = ids_BT.to(device), mask_BT.to(device)
        pos_BT = (mask_BT.long().cumsum(dim=1) - 1).clamp(min=0)
        cache = runner.new_cache()
        logits_BV = runner(ids_BT, mask_BT, pos_BT, cache)
        return cls(rows, cache, mask_BT, pos_BT[:, -1] + 1, logits_BV)

    @classmethod
    def resume(
        cls,
        runner: ModelRunner,
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
        suffix: Sequence[int],
        row: Any,
    ) -> DecodeBatch:
        """A one-row batch: a cached prefix (per layer ``[1, kv, n, d]``) plus ``suffix``.

        Encodes only ``suffix`` (positions ``n`` on); logits are for the next token.
        """
        if not suffix:
            raise ValueError("resume needs at least one new token")
        cache = runner.new_cache()
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            cache.update(k, v, i)
        n, device = keys[0].shape[2], keys[0].device
        ids_BT = torch.as_tensor([list(suffix)], dtype=torch.long, device=device)
        mask_BL = torch.ones(1, n + len(suffix), dtype=torch.bool, device=device)
        pos_BT = torch.arange(n, n + len(suffix), device=device)[None]
        logits_BV = runner(ids_BT, mask_BL, pos_BT, cache)
        return cls([row], cache, mask_BL, pos_BT[:, -1] + 1, logits_BV)

    def row_cache(self, i: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Row ``i``'s cached keys and values without padding (copies, per layer)."""
        n = int(self.mask_BL[i].sum())  # left padding: the row's columns are the last n
        keys = [layer.keys[i:i + 1, :, -n:].clone() for layer in self.cache.layers]
        values = [layer.values[i:i + 1, :, -n:].clone() for layer in self.cache.layers]
        return keys, values

    def merge(self, other: DecodeBatch) -> None:
        """Append ``other``'s rows to this batch (left-padding the shorter cache)."""
        length = max(self.cache_len, other.cache_len)
        pad_self, pad_other = length - self.cache_len, length - other.cache_len
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat(
                [_pad_left(mine.keys, pad_self, 2), _pad_left(theirs.keys, pad_other, 2)]
            )
            mine.values = torch.cat(
                [_pad_left(mine.values, pad_self, 2), _pad_left(theirs.values, pad_other, 2)]
            )
        self.mask_BL = torch.cat(
            [_pad_left(self.mask_BL, pad_self, 1), _pad_left(other.mask_BL, pad_other, 1)]
        )
        self.next_pos_B = torch.cat([self.next_pos_B, other.next_pos_B])
        self.logits_BV = torch.cat([self.logits_BV, other.logits_BV])
        self.rows = self.rows + other.rows

    def select(self, keep: Sequence[int]) -> None:
        """Keep only the rows at indices ``keep`` (in that order); trim all-padding columns."""
        if len(keep) == len(self.rows) and list(keep) == list(range(len(self.rows))):
            return
        idx = torch.as_tensor(list(keep), dtype=torch.long, device=self.mask_BL.device)
        self.cache.batch_select_indices(idx)
        self.mask_BL = self.mask_BL[idx]
        self.next_pos_B = self.next_pos_B[idx]
        self.logits_BV = self.logits_BV[idx]
        self.rows = [self.rows[i] for i in keep]
        if self.rows:
            start = int(self.mask_BL.any(dim=0).long().argmax())
            if start > 0:
                for layer in self.cache.layers:
                    layer.keys = layer.keys[:, :, start:]
                    layer.values = layer.values[:, :, start:]
                self.mask_BL = self.mask_BL[:, start:]

    def step(self, runner: ModelRunner, tokens_B: torch.Tensor) -> None:
        """Feed one token per row; ``logits_BV`` becomes the logits of the following token."""
        ones_B1 = torch.ones(len(self.rows), 1, dtype=torch.bool, device=self.mask_BL.device)
        self.mask_BL = torch.cat([self.mask_BL, ones_B1], dim=1)
        self.logits_BV = runner(
            tokens_B[:, None].to(self.mask_BL.device),
            self.mask_BL,
            self.next_pos_B[:, None],
            self.cache,
        )
        self.next_pos_B = self.next_pos_B + 1
