"""Any OpenEnv server as a sao_gym :class:`~sao_gym.core.AgentEnv` (registered by sao_gym.envs).

:class:`OpenEnvAgentEnv` talks to a server over OpenEnv's WebSocket protocol
with OpenEnv's own async client (``GenericEnvClient``); one env instance is
one server session (its own environment on the server), kept across resets:

- reset sends the seed (and ``options``, when given); the first messages and
  ``info["tools"]`` come from the server: a sao_gym server
  (:mod:`sao_gym.adapters.openenv`) sends both in its reset observation;
  for another server the tools come from a ``list_tools`` step (an MCP
  environment) and the messages from the observation's fields, as JSON;
- each tool call of an assistant message is one ``call_tool`` step, its
  result a ``tool`` message with the call's id; a message without tool calls
  (or any message, for an env without tools) is one text step
  (``{"type": "message", "content": ...}``; ``text_action_key="message"``
  sends ``{"message": ...}`` instead); arguments that are not a JSON object,
  and text to a server that takes tool calls only, are answered here, as a
  :class:`~sao_gym.tools.ToolEnv` would, without a server step;
- the rewards of a turn's steps add up; ``terminated``/``truncated``,
  ``stop_reason`` and ``infra_failure`` come from a sao_gym server's
  observation fields, else ``done`` counts as ``terminated``.

Nothing hangs on a dead or stuck server: connecting is bounded by
``connect_timeout_s``, every request by ``step_timeout_s``; a failure raises
:class:`OpenEnvError` (which :func:`~sao_gym.run_episode` records as an
infrastructure failure) and drops the connection; the next reset opens a
new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from sao_gym.core import AgentEnv, StepResult, clean_text, error_observation
from sao_gym.registration import MissingExtra
from sao_gym.spaces import message_problem
from sao_gym.tools import decode_arguments
from sao_gym.types import Message, StopReason

logger = logging.getLogger(__name__)


def raise_if_openenv_missing(error: ModuleNotFoundError, needed_by: str) -> None:
    """Raise :class:`~sao_gym.registration.MissingExtra` if ``error`` is a missing openenv."""
    if (error.name or "").partition(".")[0] in ("openenv", "websockets", "fastapi", "starlette",
                                                "uvicorn"):
        raise MissingExtra((error.name or "openenv").partition(".")[0], "openenv",
                           needed_by) from error


try:
    from openenv.core.generic_client import GenericEnvClient
    from websockets.exceptions import WebSocketException
except ModuleNotFoundError as _e:  # pragma: no cover - exercised with openenv hidden
    raise_if_openenv_missing(_e, "sao_gym.adapters.openenv (the OpenEnv adapter)")
    raise

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_STEP_TIMEOUT_S = 120.0
_CLOSE_TIMEOUT_S = 2.0
_STOP_REASONS = {r.value for r in StopReason}


class OpenEnvError(RuntimeError):
    """The OpenEnv server could not be reached, failed, timed out or broke the protocol.

    ``answered`` is true when the server answered with an error message (the
    connection is kept): it refused the request or its environment raised.
    """

    def __init__(self, message: str, *, answered: bool = False):
        super().__init__(message)
        self.answered = answered


def openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool (``name``, ``description``, ``input_schema``) as an OpenAI tool schema."""
    schema = tool.get("input_schema", tool.get("inputSchema"))
    return {"type": "function", "function": {
        "name": str(tool.get("name", "")), "description": str(tool.get("description") or ""),
        "parameters": schema if isinstance(schema, dict) and schema else
        {"type": "object", "properties": {}}}}


def observation_text(obs: dict[str, Any]) -> str:
    """The text of an OpenEnv observation that carries no messages (any server's)."""
    error = obs.get("error")
    if error:
        return f"Error: {error.get('message', error) if isinstance(error, dict) else error}"
    result = obs.get("result", obs.get("text"))
    if isinstance(result, dict) and isinstance(result.get("content"), list):  # MCP CallToolResult
        return "\n".join(str(p.get("text", "")) for p in result["content"] if isinstance(p, dict))
    if isinstance(result, str):
        return result
    if result is None:
        fields = {k: v for k, v in obs.items() if v not in (None, "", [], {})}
        result = next(iter(fields.values())) if len(fields) == 1 else fields
        if isinstance(result, str):
            return result
    return json.dumps(result, ensure_ascii=False, sort_keys=True, default=str)


async def _close(client: Any) -> None:
    """Close a client's session the way OpenEnv's server expects.

    ``GenericEnvClient.close`` closes the socket right after its ``close``
    message, and the server, closing its side, then logs an "Exception in
    ASGI application" per session; waiting for the server to close first
    avoids that.
    """
    ws = getattr(client, "_ws", None)
    if ws is not None:
        with contextlib.suppress(Exception):
            await ws.send(json.dumps({"type": "close"}))
            await ws.wait_closed()
    await client.close()


async def _last_words(client: Any) -> str | None:
    """The error a server sent before it closed the connection, if one is queued."""
    ws = getattr(client, "_ws", None)
    try:
        message = json.loads(await asyncio.wait_for(ws.recv(), 0.5)) if ws is not None else None
    except Exception:  # noqa: BLE001 - nothing queued (or nothing readable)
        return None
    if not isinstance(message, dict) or message.get("type") != "error":
        return None
    data = message.get("data") if isinstance(message.get("data"), dict) else {}
    return clean_text(f"{data.get('message', 'an error')} (code: {data.get('code', '?')})", 500)


def _valid_messages(value: Any) -> list[Message] | None:
    if not isinstance(value, list) or not value:
        return None
    if any(message_problem(m, roles=("system", "user", "tool")) for m in value):
        return None
    return [dict(m) for m in value]


class OpenEnvAgentEnv(AgentEnv):
    """An OpenEnv server's environment as an :class:`AgentEnv` (see module docs).

    Args:
        base_url: the server (``http://127.0.0.1:8000``; ``ws://`` works too).
        connect_timeout_s: the most a WebSocket connection may take to open.
        step_timeout_s: the most one reset or step may take on the server.
        list_tools: ask the server for its tools with a ``list_tools`` step
            when the reset observation carries none (``None``: yes, and a
            server that refuses means no tools; ``False``: never).
        text_action_key: ``None`` sends text as ``{"type": "message",
            "content": text}`` (a sao_gym server's action); a key such as
            ``"message"`` sends ``{key: text}`` (another server's action).
        max_message_size_mb: the largest WebSocket message accepted.

    """

    max_tool_calls_per_turn: int = 8
    """Tool calls of one assistant message that run, as in :class:`~sao_gym.tools.ToolEnv`."""

    def __init__(self, base_url: str, *, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S, list_tools: bool | None = None,
                 text_action_key: str | None = None, max_message_size_mb: float = 100.0):
        super().__init__()
        if not isinstance(base_url, str) or not base_url.startswith(
                ("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"base_url must be an http(s):// or ws(s):// URL, got {base_url!r}")
        for name, value in (("connect_timeout_s", connect_timeout_s),
                            ("step_timeout_s", step_timeout_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        self.base_url = base_url.rstrip("/")
        self.connect_timeout_s = float(connect_timeout_s)
        self.step_timeout_s = float(step_timeout_s)
        self.list_tools = list_tools
        self.text_action_key = text_action_key
        self.max_message_size_mb = max_message_size_mb
        self.task: dict[str, Any] | None = None
        self._client: Any = None
        self._tools: list[dict[str, Any]] = []
        self._seed: int | None = None

    # ----- connection -----
    async def _request(self, what: str, make: Any, *, connect: bool = False) -> Any:
        """Await ``make(client)`` within the timeouts.

        Only a reset (``connect``) opens a connection: a step never lands in a
        new server session that was not reset. A timeout or a broken
        connection drops the connection; an error answer keeps it.
        """
        fresh = self._client is None
        if fresh and not connect:
            raise OpenEnvError(f"{what}: no connection to the OpenEnv server at {self.base_url} "
                               "(it was lost earlier in this episode); reset to start anew")
        if fresh:
            self._client = GenericEnvClient(
                base_url=self.base_url, connect_timeout_s=self.connect_timeout_s,
                message_timeout_s=self.step_timeout_s,
                max_message_size_mb=self.max_message_size_mb)
        timeout = self.step_timeout_s + (self.connect_timeout_s if fresh else 0.0) + 1.0
        try:
            return await asyncio.wait_for(make(self._client), timeout)
        except asyncio.CancelledError:
            await self._drop()
            raise
        except Exception as e:  # noqa: BLE001 - every failure becomes one clear error
            answered = isinstance(e, RuntimeError) and str(e).startswith("Server error")
            if answered:
                raise self._error(what, e, answered) from e
            said = await _last_words(self._client) if isinstance(e, WebSocketException) else None
            await self._drop()
            if said is not None:  # e.g. at capacity: the server answers, then closes
                raise OpenEnvError(f"{what}: the OpenEnv server at {self.base_url} closed the "
                                   f"connection: {said}") from e
            raise self._error(what, e, answered) from e

    def _error(self, what: str, e: Exception, answered: bool) -> OpenEnvError:
        where = f"the OpenEnv server at {self.base_url}"
        if answered:
            return OpenEnvError(f"{what}: {where} answered: {clean_text(str(e), 500)}",
                                answered=True)
        if isinstance(e, TimeoutError):
            return OpenEnvError(f"{what}: no answer from {where} within {self.step_timeout_s} s")
        if isinstance(e, ConnectionError):
            return OpenEnvError(f"{what}: cannot connect to {where} ({clean_text(str(e), 300)}); "
                                "is it running (sao-gym serve-env ENV_ID --port P)?")
        if isinstance(e, (WebSocketException, OSError)):
            return OpenEnvError(f"{what}: the connection to {where} failed "
                                f"({type(e).__name__}: {clean_text(str(e), 300)})")
        return OpenEnvError(f"{what}: {where} failed: {type(e).__name__}: "
                            f"{clean_text(str(e), 500)}")

    async def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_close(client), _CLOSE_TIMEOUT_S)

    # ----- AgentEnv hooks -----
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
                     ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on the server with ``seed`` (see module docs)."""
        self._seed = seed
        return await super().areset(seed=seed, options=options)

    async def on_reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        """Reset the server's env; its messages, tools and (sao_gym server) task id."""
        data: dict[str, Any] = {} if self._seed is None else {"seed": int(self._seed)}
        if options:
            try:
                json.dumps(options)
            except (TypeError, ValueError) as e:
                raise ValueError(f"options must be JSON-serialisable for an OpenEnv server: {e}"
                                 ) from None
            data["options"] = options
        reused = self._client is not None
        try:
            result = await self._request("reset", lambda c: c.reset(**data), connect=True)
        except OpenEnvError as e:
            if not reused or e.answered:
                raise
            # a kept connection the server has closed meanwhile: reconnect once
            result = await self._request("reset", lambda c: c.reset(**data), connect=True)
        obs = result.observation if isinstance(result.observation, dict) else {}
        messages = _valid_messages(obs.get("messages")) or [
            {"role": "user", "content": observation_text(obs)}]
        if isinstance(obs.get("tools"), list):
            tools = [openai_tool(t) for t in obs["tools"] if isinstance(t, dict)]
        else:
            tools = await self._server_tools()
        info = dict(obs.get("info") or {}) if isinstance(obs.get("info"), dict) else {}
        info["tools"] = tools
        self._tools = tools
        task_id = obs.get("task_id")
        self.task = {"id": str(task_id)} if task_id not in (None, "") else None
        return messages, info

    async def _server_tools(self) -> list[dict[str, Any]]:
        if self.list_tools is False:
            return []
        try:
            result = await self._request("list_tools",
                                         lambda c: c.step({"type": "list_tools"}))
        except OpenEnvError as e:
            if self.list_tools or not e.answered:
                raise
            logger.debug("the server lists no tools (%s): a text environment", e)
            return []
        tools = (result.observation or {}).get("tools")
        return [openai_tool(t) for t in tools if isinstance(t, dict)] \
            if isinstance(tools, list) else []

    async def on_step(self, action: Message) -> StepResult:
        """One server step per tool call, or one text step (see module docs)."""
        calls = action.get("tool_calls") or []
        if not calls or not self._tools:
            text = action.get("content") or ""
            payload = {self.text_action_key: text} if self.text_action_key else \
                {"type": "message", "content": text}
            try:
                return await self._step("step", payload)
            except OpenEnvError as e:  # a server that takes tool calls only (OpenEnv's MCP envs)
                if not (e.answered and self._tools and "VALIDATION_ERROR" in str(e)):
                    raise
            names = ", ".join(t["function"]["name"] for t in self._tools)
            return error_observation(f"no tool call found. Call one of the tools: {names}."), \
                0.0, False, False, {"invalid_action": True}
        obs: list[Message] = []
        reward, terminated, truncated, info = 0.0, False, False, {}
        for i, call in enumerate(calls[: self.max_tool_calls_per_turn]):
            call_id, name = call.get("id") or f"call_{i}", call["function"]["name"]
            args, problem = decode_arguments(call["function"].get("arguments"))
            if problem is not None:
                obs.append({"role": "tool", "tool_call_id": call_id, "name": clean_text(name, 64),
                            "content": f"Error: {clean_text(name, 64)}: {problem}"})
                continue
            payload = {"type": "call_tool", "tool_name": name, "arguments": args}
            msgs, r, terminated, truncated, step_info = await self._step(
                f"call_tool {clean_text(name, 64)!r}", payload, call_id=call_id, name=name)
            obs += msgs
            reward += r
            info.update(step_info)
            if terminated or truncated:
                break
        if not (terminated or truncated) and len(calls) > self.max_tool_calls_per_turn:
            obs += error_observation(
                f"only the first {self.max_tool_calls_per_turn} tool calls of a turn run; "
                f"{len(calls) - self.max_tool_calls_per_turn} were ignored")
        return obs, reward, terminated, truncated, info

    async def _step(self, what: str, payload: dict[str, Any], *, call_id: str | None = None,
                    name: str | None = None) -> StepResult:
        result = await self._request(what, lambda c: c.step(payload))
        obs = result.observation if isinstance(result.observation, dict) else {}
        done = bool(result.done)
        if "terminated" in obs or "truncated" in obs:
            terminated, truncated = bool(obs.get("terminated")), bool(obs.get("truncated"))
            terminated |= done and not truncated
        else:
            terminated, truncated = done, False
        info = dict(obs["info"]) if isinstance(obs.get("info"), dict) else {}
        if obs.get("infra_failure"):
            info["infra_failure"] = True
        if (terminated or truncated) and obs.get("stop_reason") in _STOP_REASONS:
            info["stop_reason"] = obs["stop_reason"]
        messages = _valid_messages(obs.get("messages"))
        if messages is None:
            text = observation_text(obs)
            messages = [{"role": "tool", "tool_call_id": call_id, "name": name, "content": text}
                        if call_id is not None else {"role": "user", "content": text}]
        elif call_id is not None:
            messages = [{**m, "tool_call_id": call_id} if m["role"] == "tool" else m
                        for m in messages]
        return messages, float(result.reward or 0.0), terminated, truncated, info

    async def server_state(self) -> dict[str, Any]:
        """The server's ``state`` of this session (a sao_gym server: the episode's record)."""
        state = await self._request("state", lambda c: c.state())
        return dict(state) if isinstance(state, dict) else {"state": state}

    async def on_close(self) -> None:
        """Close the connection (the server ends the session and its env)."""
        await self._drop()
