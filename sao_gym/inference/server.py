"""``sao-gym serve``: the RL subset of vLLM's server protocol, over any in-process backend.

:func:`build_app` wraps a backend (``HFBackend`` by default) in an aiohttp
application, so inference can run in another process or on another host
without vLLM, and :class:`~sao_gym.inference.vllm_server.VLLMServerBackend`
talks to it exactly as to ``vllm serve``. Routes:

- ``POST /v1/completions``: token-id prompts only, ``n = 1``, ``logprobs``
  0 (the sampled token's logprob), ``top_k`` -1/0, no penalties; streamed
  (``"stream": true``: one chunk with every token once the generation ends,
  ``: keep-alive`` comments every ``keepalive_s`` before it) or not. Each
  choice also carries ``policy_versions``, the version of every token (an
  extension; vLLM 0.32 has none).
- ``POST /pause`` (new requests wait until ``/resume``; running ones go on,
  each token keeps its exact version), ``POST /resume``, ``GET /is_paused``.
- ``POST /collective_rpc`` with ``{"method": "reload_weights", "kwargs":
  {"weights_path": DIR}}``: reads the weights directory;
  ``POST /update_weight_version {"new_version": "7"}`` then swaps them in
  as version 7 (between two decode steps); ``GET /weight_info``.
- ``POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"}``:
  reads a LoRA adapter directory (vLLM's route); the next
  ``/update_weight_version`` merges it into the served model's weights, and
  requests may then name ``lora_name`` as their model. The adapter alone
  crosses the wire.
- ``GET /v1/models``, ``GET /server_info`` (reports
  ``logprobs_mode: processed_logprobs``), ``GET /health``;
- with the model's tokenizer, OpenAI's ``POST /v1/chat/completions`` and the
  per-episode routes of the gateway (:mod:`sao_gym.gateway.app`): messages in,
  the reply and its exact tokens out, behind the same pause.

Bad requests get HTTP 400 with vLLM's error shape
``{"error": {"message", "type", "code"}}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any

from aiohttp import web

from sao_gym.gateway.app import MAX_BODY
from sao_gym.types import Generation, SamplingParams
from sao_gym.utils.sse import keep_alive

logger = logging.getLogger(__name__)

_NEUTRAL = {"top_k": (-1, 0, None), "min_p": (0, 0.0, None), "n": (1, None),
            "repetition_penalty": (1, 1.0, None), "presence_penalty": (0, 0.0, None),
            "frequency_penalty": (0, 0.0, None), "logprobs": (0, None), "echo": (False, None)}
"""Request fields this server does not implement, with the values that mean "off"."""


class _BadRequest(ValueError):
    pass


def _error(status: int, message: str) -> web.Response:
    kind = "BadRequestError" if status == 400 else "NotFoundError" if status == 404 \
        else "InternalServerError"
    return web.json_response({"error": {"message": message, "type": kind, "code": status}},
                             status=status)


def parse_completion(body: Any, model: str, eos_token_ids: tuple[int, ...],
                     adapters: tuple[str, ...] = ()) -> tuple[list[int], SamplingParams, bool]:
    """(prompt ids, sampling params, stream) of a ``/v1/completions`` body, or ``_BadRequest``.

    The body's ``model`` is ``model`` or the name of a loaded adapter.
    """
    if not isinstance(body, dict):
        raise _BadRequest("the request body must be a JSON object")
    if body.get("model", model) not in (model, *adapters):
        raise _BadRequest(f"model {body.get('model')!r} is not served here (serving "
                          f"{[model, *adapters]!r})")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if not (isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt)):
        raise _BadRequest("prompt must be a non-empty list of token ids (this server takes no "
                          "text prompts)")
    for key, allowed in _NEUTRAL.items():
        if key in body and body[key] not in allowed:
            raise _BadRequest(f"{key}={body[key]!r} is not supported (allowed: "
                              f"{[a for a in allowed if a is not None]})")
    stop = body.get("stop")
    if stop:
        raise _BadRequest("stop strings are not supported: use stop_token_ids")
    stop_ids = body.get("stop_token_ids") or []
    if not (isinstance(stop_ids, list) and all(type(t) is int for t in stop_ids)):
        raise _BadRequest("stop_token_ids must be a list of token ids")
    if not body.get("ignore_eos", False):
        stop_ids = [*stop_ids, *(e for e in eos_token_ids if e not in stop_ids)]
    seed = body.get("seed")
    if seed is not None and type(seed) is not int:
        raise _BadRequest(f"seed must be an integer, got {seed!r}")
    session = body.get("user")  # the episode: its KV cache is reused by its next request
    if session is not None and not isinstance(session, str):
        raise _BadRequest(f"user must be a string, got {session!r}")
    try:
        params = SamplingParams(
            max_new_tokens=int(body.get("max_tokens", 16)),
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            stop_token_ids=tuple(stop_ids), seed=seed, session_id=session)
    except (TypeError, ValueError) as e:
        raise _BadRequest(str(e)) from None
    return prompt, params, bool(body.get("stream", False))


def _choice(gen: Generation) -> dict[str, Any]:
    stop = gen.token_ids[-1] if gen.finish_reason == "stop" and gen.token_ids else None
    return {"index": 0, "text": "", "token_ids": gen.token_ids,
            "logprobs": {"token_logprobs": gen.logprobs},
            "finish_reason": gen.finish_reason, "stop_reason": stop,
            "policy_versions": gen.policy_versions}


class _Server:
    """The application's state: the backend, the pause gate, staged weights."""

    def __init__(self, backend: Any, model: str, max_model_len: int,
                 eos_token_ids: tuple[int, ...], keepalive_s: float):
        self.backend, self.model, self.max_model_len = backend, model, max_model_len
        self.eos_token_ids, self.keepalive_s = eos_token_ids, keepalive_s
        self.running = asyncio.Event()
        self.running.set()
        self.staged: Any = None
        self.lock = asyncio.Lock()
        self.adapters: tuple[str, ...] = ()
        """Names of the LoRA adapter loaded (requests may name it as their model)."""

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError as e:
            return _error(400, f"the request body is not JSON: {e}")
        try:
            prompt, params, stream = parse_completion(body, self.model, self.eos_token_ids,
                                                      self.adapters)
        except _BadRequest as e:
            return _error(400, str(e))
        await self.running.wait()
        task = asyncio.ensure_future(self.backend.generate(prompt, params))
        rid, created = f"cmpl-{uuid.uuid4().hex[:16]}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": self.model}
        if not stream:
            try:
                gen = await task
            except ValueError as e:
                return _error(400, str(e))
            usage = {"prompt_tokens": len(prompt), "completion_tokens": len(gen.token_ids),
                     "total_tokens": len(prompt) + len(gen.token_ids)}
            return web.json_response({**head, "choices": [_choice(gen)], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        try:
            await keep_alive(task, resp, request, self.keepalive_s)
            try:
                gen = task.result()
            except ValueError as e:
                if not resp.prepared:
                    return _error(400, str(e))
                payload = {"error": {"message": str(e), "type": "BadRequestError", "code": 400}}
            else:
                payload = {**head, "choices": [_choice(gen)]}
            if not resp.prepared:
                await resp.prepare(request)
            await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\ndata: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            task.cancel()  # the client went away: free the batch row

    async def pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        if mode != "keep":
            return _error(400, f"pause mode {mode!r} is not supported here (only 'keep')")
        self.running.clear()
        return web.json_response({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        self.running.set()
        return web.json_response({"status": "resumed"})

    async def is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": not self.running.is_set()})

    async def collective_rpc(self, request: web.Request) -> web.Response:

        try:
            body = await request.json()
        except json.JSONDecodeError as e:
            return _error(400, f"the request body is not JSON: {e}")
        if not isinstance(body, dict) or body.get("method") != "reload_weights":
            return _error(400, "only the method 'reload_weights' is supported")
        path = (body.get("kwargs") or {}).get("weights_path")
        if not isinstance(path, str):
            return _error(400, "reload_weights needs kwargs.weights_path (a weights directory)")
        return await self._stage(path, "weights") or web.json_response({"results": [None]})

    async def _stage(self, path: str, what: str) -> web.Response | None:
        """Read the weights directory ``path`` for the next version update; an error or None."""
        from sao_gym.inference.weights import load_weights_dir

        try:
            weights = await asyncio.to_thread(load_weights_dir, path)
        except (OSError, ValueError) as e:
            return _error(400, f"cannot read {what} from {path}: {e}")
        async with self.lock:
            self.staged = weights
        return None

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        """Stage a LoRA adapter directory; the next version update merges it in."""
        from sao_gym.inference.weights import is_adapter

        try:
            body = await request.json()
        except json.JSONDecodeError as e:
            return _error(400, f"the request body is not JSON: {e}")
        name = body.get("lora_name") if isinstance(body, dict) else None
        path = body.get("lora_path") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name or not isinstance(path, str):
            return _error(400, "load_lora_adapter needs lora_name and lora_path")
        if self.adapters and name not in self.adapters and not body.get("load_inplace"):
            return _error(400, f"an adapter ({self.adapters[0]!r}) is loaded already: "
                          "one adapter at a time (load_inplace replaces it)")
        if not is_adapter(path):
            return _error(400, f"{path} is not a LoRA adapter directory (adapter_config.json)")
        failed = await self._stage(path, "the adapter")
        if failed is not None:
            return failed
        self.adapters = (name,)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def update_weight_version(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            version = int(body["new_version"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            return _error(400, 'the body must be {"new_version": "<integer>"}')
        async with self.lock:
            weights, self.staged = self.staged or {}, None
            try:
                await self.backend.update_weights(weights, version)
            except ValueError as e:
                return _error(400, f"the staged weights do not fit the model: {e}")
        return web.json_response({"success": True, "new_version": str(version)})

    async def weight_info(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": str(self.backend.policy_version)})

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "owned_by": "sao-gym",
                "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def server_info(self, request: web.Request) -> web.Response:
        config = {"model_config": {"logprobs_mode": "processed_logprobs",
                                   "max_model_len": self.max_model_len,
                                   "generation_config": "vllm"}}
        import torch

        stats = getattr(self.backend, "stats", None)
        prefill = ({"prefill_tokens": stats.prefill_tokens, "reused_tokens": stats.reused_tokens}
                   if hasattr(stats, "reused_tokens") else {})
        return web.json_response({"server": "sao-gym", "vllm_config": config,
                                  "threads": torch.get_num_threads(), **prefill})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")


def build_app(backend: Any, *, model: str = "policy", max_model_len: int,
              eos_token_ids: tuple[int, ...] = (), keepalive_s: float = 5.0,
              tokenizer: Any = None) -> web.Application:
    """The aiohttp application serving ``backend`` as ``model`` (see the module docs).

    ``eos_token_ids`` stop requests sent without ``ignore_eos``. With the
    model's ``tokenizer``, the chat gateway's routes are served too
    (:class:`~sao_gym.gateway.app.Gateway`). Closing the application closes
    the backend.
    """
    s = _Server(backend, model, max_model_len, tuple(eos_token_ids), keepalive_s)
    app = web.Application(client_max_size=MAX_BODY)
    if tokenizer is not None:
        from sao_gym.gateway.app import Gateway

        app.add_routes(Gateway(backend, tokenizer, models=lambda: (s.model, *s.adapters),
                               max_context_tokens=max_model_len, gate=s.running,
                               keepalive_s=keepalive_s).routes())
    app.add_routes([
        web.post("/v1/completions", s.completions), web.post("/pause", s.pause),
        web.post("/resume", s.resume), web.get("/is_paused", s.is_paused),
        web.post("/collective_rpc", s.collective_rpc),
        web.post("/v1/load_lora_adapter", s.load_lora_adapter),
        web.post("/update_weight_version", s.update_weight_version),
        web.get("/weight_info", s.weight_info), web.get("/v1/models", s.models),
        web.get("/server_info", s.server_info), web.get("/health", s.health),
    ])

    async def close_backend(app: web.Application) -> None:
        await backend.aclose()

    app.on_cleanup.append(close_backend)
    return app


def serve(model_path: str, *, host: str = "127.0.0.1", port: int = 8000,
          served_model_name: str = "policy", max_batch_size: int = 32,
          max_model_len: int | None = None, seed: int | None = None,
          dtype: str = "float32", device: str = "cpu", threads: int | None = None) -> None:
    """Load ``model_path`` into an ``HFBackend`` and serve it until SIGINT/SIGTERM.

    ``threads``: torch's CPU threads (default: torch's own, one per core).
    """
    import torch

    from sao_gym.inference.hf.backend import HFBackend

    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)

    async def make() -> web.Application:
        backend = HFBackend(model_path, max_batch_size=max_batch_size, seed=seed, dtype=dtype,
                            device=device)
        positions = int(getattr(backend.model.config, "max_position_embeddings", 0) or 1 << 30)
        eos = backend.model.generation_config.eos_token_id if backend.model.generation_config \
            else None
        eos_ids = tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])
        return build_app(backend, model=served_model_name, eos_token_ids=eos_ids,
                         max_model_len=min(max_model_len or positions, positions),
                         tokenizer=backend.tokenizer)

    logger.info("sao-gym serve: %s on http://%s:%d as %r", model_path, host, port,
                served_model_name)
    web.run_app(make(), host=host, port=port, print=None, access_log=None)


__all__ = ["build_app", "parse_completion", "serve"]
