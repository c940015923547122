"""Inference servers as Ray actors (``ray.server_actors: true``), owned by their rollout worker.

With ``inference.launch`` on Ray, a rollout worker's servers are by default
its child processes, on its node and its GPUs. With ``ray.server_actors``
each one is an actor of its own (:class:`ServerActor`, with
``ray.server_num_cpus`` / ``ray.server_num_gpus``, spread over the nodes)
that runs one server process listening on its node's address: the workers
can then be CPU machines running sandboxes while the servers sit on GPU
nodes.

:class:`RayServers` is the worker's launcher for them, with the interface of
:class:`~sao_gym.inference.launch.LocalServers` (``start``, ``replace``,
``stop``), so the worker's :class:`~sao_gym.inference.vllm_server.VLLMServerBackend`
replaces a dead one as it does a child process. The worker owns its server
actors: Ray ends them when the worker dies, and their processes follow on
their leash. A dead server process is started again inside its actor; a
dead actor (its process killed, its node lost) is replaced by a new one.
Both count towards ``max_restarts`` of that server.

Weights reach the servers as files the worker publishes under its run
directory: on a real cluster that must be on storage every node sees.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from sao_gym.inference.launch import LaunchError
from sao_gym.runtime.place.ray.cluster import actor_threads
from sao_gym.utils.restarts import GivenUp, Restarts

logger = logging.getLogger(__name__)


class ServerActor:
    """One inference server process on this actor's node (Ray calls these methods).

    Takes the keyword arguments of :class:`~sao_gym.inference.launch.LocalServers`
    but ``n`` and ``host`` (this node's address).
    """

    def __init__(self, model: str, **kwargs: Any):
        import ray

        from sao_gym.inference.launch import LocalServers

        self.servers = LocalServers(model, 1, host=ray.util.get_node_ip_address(), **kwargs)

    def start(self) -> str:
        """Start the server; its URL once it answers."""
        return self.servers.start()[0]

    def replace(self, url: str) -> str:
        """Start the server again (it died); its new URL."""
        return self.servers.replace(url)

    def info(self) -> dict[str, Any]:
        """The actor's pid, its server's URL and the pid of the server's leash."""
        return {"pid": os.getpid(), "url": self.servers.urls[0],
                "leash_pid": self.servers.procs[0].pid}

    def stop(self) -> None:
        """Stop the server (idempotent)."""
        self.servers.stop()


class RayServers:
    """``n`` :class:`ServerActor` servers of ``model``, launched by a rollout worker.

    Args:
        model, n: what the servers serve, and how many.
        num_cpus, num_gpus: what Ray reserves for each actor.
        log_dir: each server logs to ``log_dir/actor-<i>/server-0.log``.
        startup_timeout_s: longest wait for a server (or a new actor) to answer.
        max_restarts: replacements of each server (process or actor) before it is given up.
        **server_kwargs: the rest of :class:`~sao_gym.inference.launch.LocalServers`'
            keyword arguments (kind, python, max_model_len, ...).

    """

    def __init__(self, model: str, n: int, *, log_dir: str | os.PathLike[str],
                 num_cpus: float = 0.0, num_gpus: float = 0.0,
                 startup_timeout_s: float = 600.0, max_restarts: int = 3,
                 **server_kwargs: Any):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.model, self.n, self.log_dir = model, n, Path(log_dir)
        self.startup_timeout_s, self.max_restarts = startup_timeout_s, max_restarts
        # a server actor's threads follow Ray's rule for its CPUs, as the learner's do
        self.server_kwargs = {"threads": actor_threads(num_cpus), **server_kwargs,
                              "startup_timeout_s": startup_timeout_s,
                              "max_restarts": max_restarts}
        self.options = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": 0,
                        "scheduling_strategy": "SPREAD"}
        self.actors: list[Any] = []
        self.urls: list[str] = []
        self._restarts = Restarts(n, limit=max_restarts)
        """Times each server was replaced (its process or its actor)."""

    def _new_actor(self, i: int) -> Any:
        import ray

        return ray.remote(ServerActor).options(**self.options).remote(
            self.model, log_dir=str(self.log_dir / f"actor-{i}"), **self.server_kwargs)

    def _get(self, refs: Any, what: str) -> Any:
        import ray

        try:
            return ray.get(refs, timeout=self.startup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise LaunchError(f"{what} did not answer within {self.startup_timeout_s:.0f} s "
                              "(not enough resources in the cluster for "
                              f"{self.options['num_gpus']} GPUs each?)") from None

    def start(self) -> list[str]:
        """Start every server actor and its server; their URLs."""
        self.actors = [self._new_actor(i) for i in range(self.n)]
        try:
            self.urls = list(self._get([a.start.remote() for a in self.actors],
                                       f"{self.n} inference server actor(s)"))
        except BaseException:
            self.stop()
            raise
        logger.info("inference server actors up: %s", ", ".join(self.urls))
        return list(self.urls)

    @property
    def restarts(self) -> list[int]:
        """Replacements so far, per server."""
        return self._restarts.used

    def replace(self, url: str) -> str:
        """Start the server at ``url`` again: in its actor, or in a new actor if that is gone."""
        import ray

        if url not in self.urls:
            raise ValueError(f"{url} is not one of these servers: {self.urls}")
        i = self.urls.index(url)
        try:
            self._restarts.spend(i, f"inference server {i}")
        except GivenUp as e:
            raise LaunchError(str(e)) from None
        try:
            new = self._get(self.actors[i].replace.remote(url), f"inference server actor {i}")
        except ray.exceptions.RayActorError as e:
            logger.warning("inference server actor %d is gone (%s); starting a new one", i,
                           str(e).strip().splitlines()[0][:200] if str(e).strip() else "")
            _kill(self.actors[i])
            self.actors[i] = self._new_actor(i)
            new = self._get(self.actors[i].start.remote(), f"new inference server actor {i}")
        self.urls[i] = new
        return new

    def stop(self) -> None:
        """Stop every server, then end the actors (best effort, idempotent)."""
        import ray

        refs = []
        for actor in self.actors:
            try:
                refs.append(actor.stop.remote())
            except Exception:  # noqa: BLE001 - a dead actor has no server left
                pass
        try:
            ray.get(refs, timeout=30)
        except Exception:  # noqa: BLE001 - dead actors answer with errors
            pass
        for actor in self.actors:
            _kill(actor)


def _kill(actor: Any) -> None:
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - it may be gone already
        pass
