"""The gateway's HTTP routes: OpenAI's chat completions over a backend, per episode.

- ``POST /v1/chat/completions``: a one-off call (nothing is kept);
- ``POST /episodes`` (``{"id": ...}`` optional): open an episode; the answer
  names its ``base_url``, ``/episodes/ID/v1``, which is all an unmodified
  harness needs (``OPENAI_BASE_URL``);
- ``POST /episodes/ID/v1/chat/completions``: a call of that episode
  (:class:`~sao_gym.gateway.episode.ChatEpisode`); ``GET /episodes/ID/v1/models``;
- ``POST /episodes/ID/reward`` (``{"reward": number}``): the episode's reward,
  when the harness knows it;
- ``GET /episodes/ID``: the episode's token-exact segments; ``DELETE
  /episodes/ID``: end it (answering the same), after which its calls get 409.

Replies are OpenAI's ``chat.completion`` (or, with ``stream``, its
``chat.completion.chunk`` events, with ``: keep-alive`` comments while the
reply is sampled), plus vLLM's ``prompt_token_ids`` and ``token_ids`` when
``return_token_ids`` is set. Errors have OpenAI's shape: 400 for a bad body,
404 for an unknown episode or model, 409 for a call after its episode ended,
413 for a body over :data:`MAX_BODY` bytes (the application's ``client_max_size``),
503 when the backend fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from sao_gym.gateway.episode import ChatEpisode, Completion
from sao_gym.gateway.request import ChatRequest, GatewayError, parse_chat_request
from sao_gym.utils.sse import keep_alive

logger = logging.getLogger(__name__)

MAX_BODY = 64 << 20
"""The largest request body an application serving the gateway should accept (bytes)."""


def _error(error: GatewayError) -> web.Response:
    return web.json_response(error.body(), status=error.status)


async def read_json(request: web.Request) -> Any:
    """The request's JSON body, or :class:`GatewayError` (400 not JSON, 413 too large)."""
    try:
        return await request.json()
    except json.JSONDecodeError as e:
        raise GatewayError(f"the request body is not JSON: {e}") from None
    except web.HTTPRequestEntityTooLarge:
        raise GatewayError(f"the request body is larger than the {request.app._client_max_size}"
                           " bytes this server accepts", code="request_too_large",
                           status=413) from None


def _logprobs(tokenizer: Any, gen: Any) -> dict[str, Any]:
    content = []
    for token_id, logprob in zip(gen.token_ids, gen.logprobs, strict=True):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        content.append({"token": text, "logprob": logprob, "bytes": list(text.encode()),
                        "top_logprobs": []})
    return {"content": content}


def _usage(done: Completion) -> dict[str, int]:
    prompt, completion = len(done.prompt_ids), len(done.generation.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class Gateway:
    """The routes' state: the backend, its tokenizer, the open episodes.

    Args:
        backend: answers every call (any inference backend).
        tokenizer: the served model's tokenizer, with its chat template.
        models: names a request's ``model`` may take (the first is answered with).
        max_context_tokens: a segment's token budget (the served context).
        gate: set while new calls may start (a server's pause); None: always.
        keepalive_s: seconds between keep-alive comments of a streamed reply.
        max_new_tokens, sampling: an episode's limits
            (:class:`~sao_gym.gateway.episode.ChatEpisode`; a training run sets both).

    """

    def __init__(self, backend: Any, tokenizer: Any, *, models: Callable[[], tuple[str, ...]],
                 max_context_tokens: int, gate: asyncio.Event | None = None,
                 keepalive_s: float = 5.0, max_new_tokens: int | None = None,
                 sampling: tuple[float, float] | None = None):
        self.backend, self.tokenizer, self.models = backend, tokenizer, models
        self.max_context_tokens, self.gate, self.keepalive_s = (max_context_tokens, gate,
                                                                keepalive_s)
        self.max_new_tokens, self.sampling = max_new_tokens, sampling
        self.episodes: dict[str, ChatEpisode] = {}
        self.ended: set[str] = set()

    def routes(self) -> list[web.RouteDef]:
        """The gateway's routes (module docs)."""
        return [web.post("/v1/chat/completions", self.one_off),
                web.post("/episodes", self.open),
                web.post("/episodes/{episode}/v1/chat/completions", self.call),
                web.get("/episodes/{episode}/v1/models", self.list_models),
                web.post("/episodes/{episode}/reward", self.give_reward),
                web.get("/episodes/{episode}", self.record),
                web.delete("/episodes/{episode}", self.end)]

    def episode(self, episode_id: str) -> ChatEpisode:
        """The open episode ``episode_id``, or a :class:`GatewayError` (404, or 409 if ended)."""
        if episode_id in self.ended:
            raise GatewayError(f"episode {episode_id!r} has ended", param="episode",
                               code="episode_ended", status=409)
        if episode_id not in self.episodes:
            raise GatewayError(f"no episode {episode_id!r} (POST /episodes opens one)",
                               param="episode", code="episode_not_found", status=404)
        return self.episodes[episode_id]

    def new_episode(self, episode_id: str | None = None, *, seed: int | None = None,
                    backend: Any = None) -> ChatEpisode:
        """Open an episode; the episode (its ``episode_id``: ``episode_id`` or a new one).

        ``seed``: its sampling seed; ``backend``: its own instead of the gateway's
        (an oracle's, for demonstrations).
        """
        episode_id = episode_id or uuid.uuid4().hex
        if episode_id in self.episodes or episode_id in self.ended:
            raise GatewayError(f"episode {episode_id!r} exists already", param="id",
                               code="episode_exists", status=409)
        episode = ChatEpisode(
            backend or self.backend, self.tokenizer, max_context_tokens=self.max_context_tokens,
            episode_id=episode_id, max_new_tokens=self.max_new_tokens, sampling=self.sampling,
            seed=seed)
        self.episodes[episode_id] = episode
        return episode

    def end_episode(self, episode_id: str) -> ChatEpisode:
        """End an open episode (its later calls get 409); the episode."""
        episode = self.episode(episode_id)
        del self.episodes[episode_id]
        self.ended.add(episode_id)
        return episode

    # ----- routes -----
    async def open(self, request: web.Request) -> web.Response:
        """``POST /episodes``: open an episode; its id and base URL (201)."""
        try:
            body = await read_json(request) if request.can_read_body else {}
            if not isinstance(body, dict) or set(body) - {"id"} or not isinstance(
                    body.get("id", ""), str):
                raise GatewayError('the body must be {} or {"id": "..."}')
            episode_id = self.new_episode(body.get("id") or None).episode_id
        except GatewayError as e:
            return _error(e)
        return web.json_response({"id": episode_id, "base_url": f"/episodes/{episode_id}/v1"},
                                 status=201)

    async def give_reward(self, request: web.Request) -> web.Response:
        """``POST /episodes/ID/reward`` (``{"reward": number}``): the episode's reward."""
        from sao_gym.gateway.harness import HarnessFailed, as_reward

        try:
            episode = self.episode(request.match_info["episode"])
            body = await read_json(request)
            if not isinstance(body, dict) or set(body) != {"reward"}:
                raise GatewayError('the body must be {"reward": number}', param="reward")
            try:
                episode.reward = as_reward(body["reward"], where="the posted reward")
            except HarnessFailed as e:
                raise GatewayError(str(e), param="reward") from None
        except GatewayError as e:
            return _error(e)
        return web.json_response({"id": request.match_info["episode"],
                                  "reward": episode.reward})

    async def record(self, request: web.Request) -> web.Response:
        """``GET /episodes/ID``: the episode's token-exact segments."""
        return self._segments(request, self.episode)

    async def end(self, request: web.Request) -> web.Response:
        """``DELETE /episodes/ID``: end the episode; its segments."""
        return self._segments(request, self.end_episode)

    def _segments(self, request: web.Request, find: Callable[[str], ChatEpisode]
                  ) -> web.Response:
        episode_id = request.match_info["episode"]
        try:
            episode = find(episode_id)
        except GatewayError as e:
            return _error(e)
        return web.json_response(self._record(episode_id, episode))

    async def list_models(self, request: web.Request) -> web.Response:
        """``GET /episodes/ID/v1/models``: the served model names."""
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "sao-gym"}
            for m in self.models()]})

    async def one_off(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``: a call of no episode."""
        episode = ChatEpisode(self.backend, self.tokenizer,
                              max_context_tokens=self.max_context_tokens)
        return await self._answer(request, episode)

    async def call(self, request: web.Request) -> web.StreamResponse:
        """``POST /episodes/ID/v1/chat/completions``: a call of an episode."""
        try:
            episode = self.episode(request.match_info["episode"])
        except GatewayError as e:
            return _error(e)
        return await self._answer(request, episode)

    # ----- answering -----
    @staticmethod
    def _record(episode_id: str, episode: ChatEpisode) -> dict[str, Any]:
        return {"id": episode_id, "calls": episode.calls, "segments": [
            {"token_ids": t.token_ids, "loss_mask": t.loss_mask, "logprobs": t.logprobs,
             "policy_versions": t.policy_versions, "messages": t.messages}
            for t in episode.segments()]}

    async def _complete(self, episode: ChatEpisode, chat: ChatRequest) -> Completion:
        from sao_gym.inference.base import BackendClosed, InferenceError

        if self.gate is not None:
            await self.gate.wait()
        try:
            return await episode.complete(chat)
        except (InferenceError, BackendClosed) as e:  # BackendClosed: the run is stopping
            raise GatewayError(f"the inference backend failed: {e}", code="backend_error",
                               status=503, kind="server_error") from None
        except GatewayError:
            raise
        except Exception as e:  # a bug of ours: an OpenAI-shaped 500, and the log has it all
            logger.exception("answering a chat call failed")
            raise GatewayError(f"the gateway failed: {type(e).__name__}: {e}",
                               code="internal_error", status=500, kind="server_error") from None

    async def _answer(self, request: web.Request, episode: ChatEpisode) -> web.StreamResponse:
        try:
            body = await read_json(request)
            chat = parse_chat_request(body, models=self.models())
        except GatewayError as e:
            return _error(e)
        head = {"id": f"chatcmpl-{random.getrandbits(96):024x}", "created": int(time.time()),
                "model": body["model"]}
        task = asyncio.ensure_future(self._complete(episode, chat))
        if not chat.stream:
            try:
                done = await task
            except GatewayError as e:
                return _error(e)
            return web.json_response(self._completion(head, chat, done))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        try:
            await keep_alive(task, resp, request, self.keepalive_s)
            try:
                events = self._chunks(head, chat, task.result())
            except GatewayError as e:
                if not resp.prepared:
                    return _error(e)
                events = [e.body()]
            if not resp.prepared:
                await resp.prepare(request)
            for event in events:
                await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            task.cancel()  # the client went away mid-call

    def _completion(self, head: dict[str, Any], chat: ChatRequest,
                    done: Completion) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "message": done.message,
                                  "finish_reason": done.finish_reason,
                                  "logprobs": _logprobs(self.tokenizer, done.generation)
                                  if chat.logprobs else None}
        out = {**head, "object": "chat.completion", "choices": [choice], "usage": _usage(done)}
        if chat.return_token_ids:
            choice["token_ids"] = done.generation.token_ids
            out["prompt_token_ids"] = done.prompt_ids
        return out

    def _chunks(self, head: dict[str, Any], chat: ChatRequest,
                done: Completion) -> list[dict[str, Any]]:
        head = {**head, "object": "chat.completion.chunk"}

        def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> dict:
            return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                         **more}]}

        first: dict[str, Any] = {}
        if chat.logprobs:
            first["logprobs"] = _logprobs(self.tokenizer, done.generation)
        if chat.return_token_ids:
            first["token_ids"] = done.generation.token_ids
        events = [chunk({"role": "assistant", "content": done.message.get("content") or ""},
                        **first)]
        calls = done.message.get("tool_calls") or []
        if calls:
            events.append(chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}))
        last = chunk({}, done.finish_reason)
        if chat.return_token_ids:
            last["prompt_token_ids"] = done.prompt_ids
        events.append(last)
        if chat.include_usage:
            events.append({**head, "choices": [], "usage": _usage(done)})
        return events


__all__ = ["Gateway"]
