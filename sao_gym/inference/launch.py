"""Starting and stopping local inference servers: :class:`LocalServers`.

``inference.launch: N`` makes the trainer start N servers on 127.0.0.1 (free
ports; another ``host`` for servers other machines use), wait until each
answers ``/v1/models``, and stop them at the end. A server is ``vllm serve``
(run as ``python -m vllm.entrypoints.openai.api_server`` with the flags RL
needs, see :func:`vllm_command`) or ``sao-gym serve``
(:func:`sao_serve_command`).
Each server's output goes to ``log_dir/server-<i>.log``; a server that exits
or does not come up in time raises :class:`LaunchError` with the end of its
log. :meth:`LocalServers.replace` starts a dead server again (at most
``max_restarts`` times each). Every server runs on a leash
(:mod:`sao_gym.inference.leash`): it stops when the process that launched it
dies, even by SIGKILL, so a killed trainer or Ray worker leaves none behind.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from sao_gym.inference.base import InferenceError
from sao_gym.utils.restarts import GivenUp, Restarts

logger = logging.getLogger(__name__)


class LaunchError(InferenceError):
    """A local server did not start."""


def has_vllm(python: str) -> bool:
    """Whether ``python`` can import vllm (without importing it here)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=60)
        return done.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


MIN_BATCHED_TOKENS = 2048
"""The vLLM server's token budget per engine step at least (vLLM's CPU default)."""

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM takes."""


def vllm_command(python: str, model: str, port: int, *, served_model_name: str = "policy",
                 max_model_len: int, dtype: str = "float32", host: str = "127.0.0.1",
                 max_lora_rank: int | None = None) -> list[str]:
    """``vllm serve`` with what RL needs.

    ``--logprobs-mode processed_logprobs``: logprobs after temperature (the
    sampler's); ``--generation-config vllm``: no sampling defaults from the
    checkpoint; ``--enforce-eager``: no graph capture (fast start, CPU builds);
    ``--enable-prefix-caching``: an episode's next turn reuses the KV of the
    conversation so far (vLLM's default, made explicit);
    ``--no-enable-chunked-prefill`` (with a token budget of at least
    ``max_model_len``, so every prompt fits one step): vLLM's CPU build kills
    its engine when a request with a ``seed`` (every agent turn has one) is
    prefilled in chunks (it rewinds the request's generator by an offset that
    CPU generators do not have), which many concurrent long prompts cause.
    ``max_lora_rank``: serve LoRA adapters up to that rank (one at a time;
    vLLM's next allowed rank). The environment must also set
    ``VLLM_SERVER_DEV_MODE=1`` (the weight-update routes) and, for adapters,
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``: :class:`LocalServers` does.
    """
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--host", host, "--port", str(port), "--dtype", dtype, "--enforce-eager",
           "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
           "--max-model-len", str(max_model_len), "--served-model-name", served_model_name,
           "--enable-prefix-caching", "--no-enable-chunked-prefill",
           "--max-num-batched-tokens", str(max(max_model_len, MIN_BATCHED_TOKENS))]
    if max_lora_rank is not None:
        allowed = [r for r in LORA_RANKS if r >= max_lora_rank]
        if not allowed:
            raise ValueError(f"vLLM serves LoRA ranks up to {LORA_RANKS[-1]}, not {max_lora_rank}")
        cmd += ["--enable-lora", "--max-lora-rank", str(allowed[0]), "--max-loras", "1"]
    return cmd


def sao_serve_command(python: str, model: str, port: int, *, served_model_name: str = "policy",
                      max_model_len: int, max_batch_size: int = 32, host: str = "127.0.0.1",
                      threads: int | None = None) -> list[str]:
    """``sao-gym serve`` on the same protocol (HFBackend in the server process)."""
    cmd = [python, "-m", "sao_gym.cli", "serve", model, "--host", host, "--port", str(port),
           "--served-model-name", served_model_name, "--max-model-len", str(max_model_len),
           "--max-batch-size", str(max_batch_size)]
    return cmd + (["--threads", str(threads)] if threads is not None else [])


def shared_threads(n: int, cores: int | None = None) -> int:
    """Threads for each of ``n`` servers sharing ``cores`` with their launcher.

    ``cores // (n + 1)``, at least 1 (``cores``: this machine's by default). One
    per core in every process would oversubscribe the cores, and OpenMP's threads
    then wait on each other (measured: a test 80x slower with a core busy).
    """
    return max(1, (cores or os.cpu_count() or 1) // (n + 1))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalServers:
    """N inference servers of ``model`` on this machine, as child processes.

    Args:
        model: checkpoint directory the servers load.
        n: how many.
        kind: ``vllm``, ``sao`` or ``auto`` (vLLM when ``python`` can import it).
        python: the interpreter that runs them (default: this one).
        log_dir: where their logs go.
        max_model_len: their context limit.
        max_batch_size: rows a ``sao-gym serve`` decodes together.
        startup_timeout_s: longest wait for all of them (and for a replacement).
        max_restarts: times :meth:`replace` may start each server again.
        threads: torch threads of each ``sao-gym serve`` server (default:
            :func:`shared_threads`; vLLM servers keep their own rule).
        host: the address they listen on and are reached at (default: loopback; a
            Ray node's address for servers other nodes use).
        max_lora_rank: vLLM servers accept LoRA adapters up to this rank (None:
            none; ``sao-gym serve`` always accepts them).

    """

    def __init__(self, model: str, n: int, *, kind: str = "auto", python: str | None = None,
                 log_dir: str | os.PathLike[str], max_model_len: int, served_model_name: str =
                 "policy", max_batch_size: int = 32, startup_timeout_s: float = 600.0,
                 max_restarts: int = 3, host: str = "127.0.0.1", threads: int | None = None,
                 max_lora_rank: int | None = None):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if kind not in ("auto", "vllm", "sao"):
            raise ValueError(f"kind must be auto, vllm or sao, got {kind!r}")
        self.python = python or sys.executable
        if kind == "auto":
            kind = "vllm" if has_vllm(self.python) else "sao"
        self.model, self.n, self.kind = model, n, kind
        self.log_dir = Path(log_dir)
        self.max_model_len, self.served_model_name = max_model_len, served_model_name
        self.max_batch_size, self.startup_timeout_s = max_batch_size, startup_timeout_s
        self.max_restarts, self.host = max_restarts, host
        self.max_lora_rank = max_lora_rank
        self.threads = threads if threads is not None else shared_threads(n)
        self._restarts = Restarts(n, limit=max_restarts)
        """Times each server was started again (:meth:`replace`)."""
        self.procs: list[subprocess.Popen] = []
        self.urls: list[str] = []
        self._lock = threading.Lock()  # replace() and stop() may run in different threads
        self._stopped = False

    def start(self) -> list[str]:
        """Start all servers and wait until they answer; return their base URLs."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.n):
            proc, url = self._spawn(i)
            self.procs.append(proc)
            self.urls.append(url)
        logger.info("starting %d %s server(s): %s", self.n, self.kind, ", ".join(self.urls))
        try:
            self._wait(range(self.n))
        except BaseException:
            self.stop()
            raise
        return list(self.urls)

    @property
    def restarts(self) -> list[int]:
        """Replacements so far, per server."""
        return self._restarts.used

    def replace(self, url: str) -> str:
        """Start a new server in place of the one at ``url`` (killed first); its URL.

        It serves ``model`` (the caller loads newer weights into it). Raises
        :class:`LaunchError` when that server was replaced ``max_restarts``
        times already, or when the new one does not come up.
        """
        if url not in self.urls:
            raise ValueError(f"{url} is not one of these servers: {self.urls}")
        i = self.urls.index(url)
        with self._lock:
            if self._stopped:
                raise LaunchError("the servers were stopped")
            try:
                self._restarts.spend(i, f"{self.kind} server {i}")
            except GivenUp as e:
                raise LaunchError(f"{e}:\n{self.log_tail(i)}") from None
            self.kill(i)
            self.procs[i], self.urls[i] = self._spawn(i)
        logger.warning("starting %s server %d again (restart %d of %d) at %s", self.kind, i,
                       self.restarts[i], self.max_restarts, self.urls[i])
        self._wait([i])
        return self.urls[i]

    def _spawn(self, i: int) -> tuple[subprocess.Popen, str]:
        """Start server ``i`` on a free port, on a leash, logging to its file; (process, URL)."""
        port = free_port(self.host)
        if self.kind == "vllm":
            cmd = vllm_command(self.python, self.model, port, max_model_len=self.max_model_len,
                               served_model_name=self.served_model_name, host=self.host,
                               max_lora_rank=self.max_lora_rank)
        else:
            cmd = sao_serve_command(self.python, self.model, port,
                                    max_model_len=self.max_model_len,
                                    served_model_name=self.served_model_name,
                                    max_batch_size=self.max_batch_size, host=self.host,
                                    threads=self.threads)
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        if self.max_lora_rank is not None:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        # the leash ends the server when this process dies, however it dies
        leashed = [sys.executable, "-m", "sao_gym.inference.leash", "--", *cmd]
        with open(self.log_dir / f"server-{i}.log", "ab") as log:
            if self.restarts[i]:
                log.write(f"\n--- restart {self.restarts[i]} ---\n".encode())
                log.flush()
            proc = subprocess.Popen(leashed, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        return proc, f"http://{self.host}:{port}"

    def _wait(self, indices: Iterable[int]) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        pending = {i: self.urls[i] for i in indices}
        while pending:
            for i, url in list(pending.items()):
                code = self.procs[i].poll()
                if code is not None:
                    raise LaunchError(f"{self.kind} server {i} exited with {code} before it "
                                      f"answered:\n{self.log_tail(i)}")
                try:
                    with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
                        if r.status == 200:
                            del pending[i]
                except (urllib.error.URLError, OSError):
                    pass
            if pending and time.monotonic() > deadline:
                raise LaunchError(f"{self.kind} server(s) {sorted(pending)} did not answer within "
                                  f"{self.startup_timeout_s:.0f} s:\n{self.log_tail(min(pending))}")
            if pending:
                time.sleep(0.5)

    def log_tail(self, i: int, lines: int = 30) -> str:
        """The last ``lines`` lines of server ``i``'s log."""
        path = self.log_dir / f"server-{i}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` and its children (for fault tests)."""
        try:
            os.killpg(self.procs[i].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.procs[i].wait()

    def stop(self) -> None:
        """Stop every server: SIGTERM to its process group, SIGKILL after 15 s (idempotent)."""
        with self._lock:
            self._stopped = True
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for i, p in enumerate(self.procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(i)

    def __enter__(self) -> LocalServers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["LaunchError", "LocalServers", "free_port", "has_vllm", "sao_serve_command",
           "vllm_command"]
