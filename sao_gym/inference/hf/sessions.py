"""KV reuse across the turns of one episode for :class:`~sao_gym.inference.hf.backend.HFBackend`.

A multi-turn agent sends, at every turn, the whole conversation so far: the
previous prompt, the tokens it sampled, and the new observation. Encoding
it again each turn prefills O(n^2) tokens over an episode of n turns. When a
request carries a ``SamplingParams.session_id`` (the agent sets one per
episode), the backend keeps the finished request's KV cache in a
:class:`SessionCache`, keyed by the session, with the policy version whose
weights computed it. The session's next request prefills only the tokens
after the cached prefix:

- **exactness**: an entry is used only when its version is the backend's
  current one and its tokens are a prefix of the new prompt; a weight update
  drops every entry (the KV of old weights would give the new weights'
  tokens other logprobs than a fresh forward pass), so each recorded
  logprob still comes from one set of weights over the whole context;
- **memory**: entries are bounded by ``max_bytes`` together, least recently
  used evicted first; a cache entry is handed to the request that reuses
  it (not copied) and comes back, extended, when that request finishes.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class SessionEntry:
    """The KV of ``tokens`` (one row, no padding) computed by weights ``version``."""

    tokens: list[int]
    version: int
    keys: list[torch.Tensor]
    """Per layer ``[1, kv_heads, len(tokens), head_dim]``."""
    values: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        """Bytes of the cached tensors."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class SessionCache:
    """Finished requests' KV caches by session, under a byte budget (module docs)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[str, SessionEntry] = collections.OrderedDict()
        self.nbytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, session: str, entry: SessionEntry) -> None:
        """Keep ``entry`` for ``session`` (replacing its old one), evicting the oldest to fit.

        An entry larger than the whole budget is not kept.
        """
        self.discard(session)
        size = entry.nbytes
        if size > self.max_bytes:
            return
        while self._entries and self.nbytes + size > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.nbytes -= old.nbytes
            self.evictions += 1
        self._entries[session] = entry
        self.nbytes += size

    def take(self, session: str, prompt: Sequence[int], version: int) -> SessionEntry | None:
        """The session's entry if it holds a proper prefix of ``prompt`` at ``version``.

        The entry leaves the cache either way: a stale or diverged one is of
        no further use, a matching one now belongs to the request.
        """
        entry = self._entries.pop(session, None)
        if entry is None:
            return None
        self.nbytes -= entry.nbytes
        n = len(entry.tokens)
        if entry.version != version or n >= len(prompt) or list(prompt[:n]) != entry.tokens:
            return None
        return entry

    def discard(self, session: str) -> None:
        """Forget ``session``'s entry."""
        old = self._entries.pop(session, None)
        if old is not None:
            self.nbytes -= old.nbytes

    def clear(self) -> None:
        """Forget every entry (after a weight update)."""
        self._entries.clear()
        self.nbytes = 0


__all__ = ["SessionCache", "SessionEntry"]
