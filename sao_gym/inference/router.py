"""Choosing a server for each request: :class:`Router` (pure bookkeeping, no I/O).

Rules, in order:

1. A request with a ``session`` (an episode's key, set by the agent) goes to
   the server that served the session before, while that server is alive:
   its prefix cache holds the episode's context.
2. Otherwise it goes to the live server with the *least outstanding work*:
   the sum, over its requests in flight, of prompt tokens / ``prefill_cost``
   plus the decode budget (``max_new_tokens``). Ties go round-robin.
3. A server marked dead is never chosen again; its sessions move on their
   next request. With no live server left, :meth:`Router.acquire` raises
   :class:`NoServersAvailable`. A replacement comes in as a new server
   (:meth:`Router.add`).
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field

from sao_gym.inference.base import InferenceError


class NoServersAvailable(InferenceError):
    """Every inference server is down."""


@dataclass(eq=False)
class Server:
    """One server as the router sees it."""

    url: str
    outstanding: float = 0.0
    """Work in flight (see the module docs)."""
    in_flight: int = 0
    """Requests in flight."""
    alive: bool = True
    dead_reason: str = ""
    version: int = 0
    """Policy version the server samples with, as far as the client knows."""
    served: int = 0
    """Requests completed."""
    info: dict = field(default_factory=dict)
    """What the server said about itself at start (max_model_len, ...)."""
    adapter: str | None = None
    """The LoRA adapter loaded on it, which requests name as their model (None: none)."""


class Router:
    """Least-outstanding-work routing with sticky sessions over ``urls``.

    ``max_sessions`` bounds the session table (oldest sessions are forgotten
    first); ``prefill_cost`` is how many prompt tokens weigh as much as one
    decoded token.
    """

    def __init__(self, urls: list[str], *, max_sessions: int = 65536, prefill_cost: float = 16.0):
        if not urls:
            raise ValueError("at least one server URL is needed")
        if len(set(urls)) != len(urls):
            raise ValueError(f"server URLs must be distinct, got {urls}")
        self.servers = [Server(u) for u in urls]
        self.max_sessions = max_sessions
        self.prefill_cost = prefill_cost
        self._sessions: collections.OrderedDict[str, Server] = collections.OrderedDict()
        self._rr = itertools.count()

    @property
    def alive(self) -> list[Server]:
        """The servers still in use."""
        return [s for s in self.servers if s.alive]

    def cost(self, prompt_tokens: int, max_new_tokens: int) -> float:
        """The work one request adds to its server."""
        return prompt_tokens / self.prefill_cost + max_new_tokens

    def acquire(self, cost: float, session: str | None = None) -> Server:
        """Choose a server for a request of ``cost`` and count it as in flight there."""
        server = self._sessions.get(session) if session is not None else None
        if server is None or not server.alive:
            live = self.alive
            if not live:
                raise NoServersAvailable(self.down_message())
            turn = next(self._rr)
            n = len(live)
            server = min((live[(turn + i) % n] for i in range(n)), key=lambda s: s.outstanding)
        if session is not None:
            self._sessions[session] = server
            self._sessions.move_to_end(session)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        server.outstanding += cost
        server.in_flight += 1
        return server

    def release(self, server: Server, cost: float, *, ok: bool = True) -> None:
        """A request acquired with ``cost`` ended (``ok``: it returned a result)."""
        server.outstanding = max(0.0, server.outstanding - cost)
        server.in_flight -= 1
        server.served += ok

    def mark_dead(self, server: Server, reason: str) -> bool:
        """Take ``server`` out of use; True if it was alive until now."""
        if not server.alive:
            return False
        server.alive, server.dead_reason = False, reason
        for key in [k for k, s in self._sessions.items() if s is server]:
            del self._sessions[key]
        return True

    def add(self, server: Server) -> None:
        """Put a new server (a replacement) in use; its URL must differ from the live ones'."""
        if any(s.url == server.url for s in self.alive):
            raise ValueError(f"{server.url} is already in use")
        server.alive = True
        self.servers.append(server)

    def down_message(self) -> str:
        """Why no server is available: each one's reason."""
        reasons = "; ".join(f"{s.url}: {s.dead_reason}" for s in self.servers)
        return f"no inference server is available ({reasons})"


__all__ = ["NoServersAvailable", "Router", "Server"]
