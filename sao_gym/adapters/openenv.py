"""OpenEnv in both directions: serve a sao_gym env as an OpenEnv server, or use one.

Serving: :class:`SaoGymOpenEnv` is an OpenEnv ``Environment`` over any
registered env id, driven through an :class:`~sao_gym.adapters.session.EnvSession`
(so its sync ``reset``/``step`` work inside the server's running event loop,
and every WebSocket session gets an env of its own). :func:`create_app`
returns OpenEnv's own FastAPI app for it; :func:`serve_env` (and ``sao-gym
serve-env ENV_ID --port P``) runs it with uvicorn. Actions
(:class:`SaoGymAction` on the wire):

- ``{"type": "list_tools"}`` (MCP's ``ListToolsAction``): the env's tools,
  each ``input_schema`` exactly the env's ``parameters``; no env step;
- ``{"type": "call_tool", "tool_name": ..., "arguments": {...}}``
  (``CallToolAction``): exactly one env step of an assistant message with
  that one call; a bad call (unknown tool, wrong arguments) is the env's
  error text, not a server error;
- ``{"type": "message", "content": ...}``: one env step of a text message
  (what a text env, one without tools, reads).

Observations say ``done`` (terminated or truncated) and this step's
``reward``; OpenEnv's wire format drops ``metadata``, so what a client needs
is in fields too (``messages``, ``terminated``, ``truncated``,
``stop_reason``, ``infra_failure``, ``info``; on reset also ``tools`` and
``task_id``), and in ``metadata`` for in-process callers. An env that raises
ends its episode as an infrastructure failure (``stop_reason`` ``env_error``).

Using a server: :class:`~sao_gym.adapters.openenv_client.OpenEnvAgentEnv`
(registered by ``sao_gym.envs``). docs/interop.md has the recipe and
what each direction loses.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from sao_gym.adapters.loop import shared_loop
from sao_gym.adapters.openenv_client import (
    OpenEnvAgentEnv,
    OpenEnvError,
    openai_tool,
    raise_if_openenv_missing,
)
from sao_gym.adapters.session import EnvSession, StepOutcome

try:
    from openenv.core.env_server.http_server import create_app as openenv_create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.mcp_types import (
        CallToolAction,
        CallToolObservation,
        ListToolsAction,
        ListToolsObservation,
        Tool,
        ToolError,
        ToolErrorType,
    )
    from openenv.core.env_server.types import (
        Action,
        ConcurrencyConfig,
        EnvironmentMetadata,
        Observation,
        State,
    )
    from pydantic import BaseModel, Field, model_validator
    from pydantic_core import PydanticCustomError
    from starlette.websockets import WebSocketDisconnect
except ModuleNotFoundError as _e:  # pragma: no cover - exercised with openenv hidden
    raise_if_openenv_missing(_e, "sao_gym.adapters.openenv (the OpenEnv adapter)")
    raise

__all__ = ["OpenEnvAgentEnv", "OpenEnvError", "SaoGymAction", "SaoGymCallToolObservation",
           "SaoGymObservation", "SaoGymOpenEnv", "SaoGymResetObservation", "SaoGymState",
           "create_app", "mcp_tool", "openai_tool", "serve_app", "serve_env"]

DEFAULT_MAX_SESSIONS = 32
WS_MAX_SIZE = 100 * 1024 * 1024
"""The largest WebSocket message the server takes (OpenEnv's client default)."""


class SaoGymAction(Action):
    """Every action a sao_gym server takes: list tools, call a tool, or send text."""

    type: Literal["list_tools", "call_tool", "message"] = Field(
        default="message", description="list_tools, call_tool or message")
    tool_name: str | None = Field(default=None, description="call_tool: the tool")
    arguments: dict[str, Any] | str = Field(
        default_factory=dict, description="call_tool: the arguments (an object or JSON text)")
    content: str | None = Field(default=None, description="message: the assistant's text")

    @model_validator(mode="after")
    def _complete(self) -> SaoGymAction:
        # a PydanticCustomError, not a ValueError: OpenEnv's server sends the errors as
        # JSON, and a ValueError in them fails that and ends the session
        if self.type == "call_tool" and self.tool_name is None:
            raise PydanticCustomError("tool_name_missing", "a call_tool action needs a tool_name")
        if self.type == "message" and self.content is None:
            raise PydanticCustomError("content_missing", "a message action needs content")
        return self


class _Episode(BaseModel):
    """Observation fields that say where the episode stands (the wire drops metadata)."""

    messages: list[dict[str, Any]] = Field(
        default_factory=list, description="the env's new messages (OpenAI format)")
    terminated: bool = Field(default=False, description="the task ended")
    truncated: bool = Field(default=False, description="a limit cut the episode")
    stop_reason: str | None = Field(default=None, description="why the episode ended")
    infra_failure: bool = Field(default=False, description="the env failed (not the agent)")
    info: dict[str, Any] = Field(default_factory=dict, description="the step's JSON-safe info")


class SaoGymObservation(Observation, _Episode):
    """The observation of a text step (and the base of the reset one)."""

    text: str = Field(default="", description="the messages' contents, one per line")


class SaoGymResetObservation(SaoGymObservation):
    """The first observation: the task's messages and the env's tools."""

    tools: list[Tool] = Field(default_factory=list, description="the env's tools (MCP)")
    task_id: str | None = Field(default=None, description="the task's id (not its answer)")


class SaoGymCallToolObservation(CallToolObservation, _Episode):
    """The observation of one tool call: MCP's fields (``result`` is the text) and the episode's."""


class SaoGymState(State):
    """The session's episode: OpenEnv's ``episode_id``/``step_count`` and sao_gym's record."""

    env_id: str = ""
    reward: float = 0.0
    done: bool = True
    terminated: bool = False
    truncated: bool = False
    stop_reason: str | None = None
    infra_failure: bool = False


def mcp_tool(schema: dict[str, Any]) -> Tool:
    """An OpenAI tool schema as an MCP :class:`Tool` (the parameters unchanged)."""
    fn = schema.get("function", schema)
    return Tool(name=fn["name"], description=fn.get("description") or "",
                input_schema=fn.get("parameters") or {"type": "object", "properties": {}})


def _safe(value: Any) -> Any:
    """``value`` with every string encodable as UTF-8 (lone surrogates replaced)."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list):
        return [_safe(v) for v in value]
    if isinstance(value, dict):
        return {_safe(k): _safe(v) for k, v in value.items()}
    return value


def json_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-serialisable entries of an env info (``tools`` left out: they travel apart)."""
    out = {}
    for key, value in info.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            continue
        if key != "tools" and isinstance(key, str):
            out[key] = _safe(value)
    return out


class SaoGymOpenEnv(Environment):
    """A registered sao_gym env as an OpenEnv ``Environment`` (see module docs).

    Args:
        env_id: a registered id, made with :func:`sao_gym.make` and ``env_kwargs``.
        step_timeout_s: the most one env step may take (then an infra failure);
            a step's own ``timeout_s`` wins.
        max_episode_steps: the env's turn limit (default: its registration's).
        **env_kwargs: constructor options of the env.

    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, *, step_timeout_s: float | None = None,
                 max_episode_steps: int | None = None, **env_kwargs: Any) -> None:
        super().__init__()
        self.env_id = env_id
        self.step_timeout_s = step_timeout_s
        self._loop = shared_loop()
        # no EpisodeStatistics: its wall-clock "episode" info is the client's to record
        env_kwargs.setdefault("record_statistics", False)
        self.session = EnvSession(env_id, loop=self._loop, max_episode_steps=max_episode_steps,
                                  **env_kwargs)
        self._episode_id: str | None = None

    # ----- OpenEnv API -----
    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          options: dict[str, Any] | None = None,
                          **kwargs: Any) -> SaoGymResetObservation:
        """Start an episode; its messages, tools and task id."""
        messages, info = await self.session.areset(seed=seed, options=options)
        self._episode_id = episode_id or uuid.uuid4().hex
        tools = self.session.tools
        env = self.session.env
        task = getattr(env.unwrapped, "task", None) if env is not None else None
        task_id = task.get("id") if isinstance(task, Mapping) else info.get("task_id")
        messages = _safe(list(messages))
        return SaoGymResetObservation(
            messages=messages, text="\n".join(str(m.get("content") or "") for m in messages),
            tools=[mcp_tool(t) for t in tools], task_id=None if task_id is None else str(task_id),
            info=json_info(info), reward=None, done=False,
            metadata={"messages": messages, "tools": tools, **self._status()})

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> SaoGymResetObservation:
        """Sync :meth:`reset_async` (works inside a running event loop too)."""
        return self._loop.run(self.reset_async(seed=seed, episode_id=episode_id, **kwargs))

    async def step_async(self, action: Any, timeout_s: float | None = None,
                         **kwargs: Any) -> Observation:
        """Apply one action (see module docs)."""
        kind, name, arguments, content = _parse_action(action)
        if kind == "list_tools":
            return ListToolsObservation(tools=[mcp_tool(t) for t in self.tools()],
                                        metadata=self._status())
        timeout = timeout_s if timeout_s is not None else self.step_timeout_s
        if kind == "call_tool":
            outcome = await self.session.acall_tool(name, arguments, timeout=timeout)
            error = ToolError(error_type=ToolErrorType.EXECUTION_ERROR, message=outcome.text) \
                if outcome.info.get("infra_failure") else None
            return SaoGymCallToolObservation(tool_name=name, result=_safe(outcome.text),
                                             error=error, **self._fields(outcome))
        outcome = await self.session.asend(content, timeout=timeout)
        return SaoGymObservation(text=_safe(outcome.text), **self._fields(outcome))

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """Sync :meth:`step_async` (works inside a running event loop too)."""
        return self._loop.run(self.step_async(action, timeout_s=timeout_s))

    @property
    def state(self) -> SaoGymState:
        """The current episode's record."""
        s = self.session
        return SaoGymState(episode_id=self._episode_id, step_count=s.turns, env_id=self.env_id,
                           reward=s.reward, done=s.done, **self._status())

    def get_metadata(self) -> EnvironmentMetadata:
        """Name, description and version of the served env."""
        import sao_gym

        return EnvironmentMetadata(name=self.env_id, version=sao_gym.__version__,
                                   description=f"the sao_gym environment {self.env_id}")

    def close(self) -> None:
        """Close the env (OpenEnv calls this when the session ends)."""
        self.session.close()

    # ----- helpers -----
    def tools(self) -> list[dict[str, Any]]:
        """The env's OpenAI tool schemas: the episode's, or before a reset its class's."""
        if self.session.started:
            return self.session.tools
        return _declared_tools(self.env_id)

    def _status(self) -> dict[str, Any]:
        s = self.session
        return {"terminated": s.terminated, "truncated": s.truncated,
                "stop_reason": s.stop_reason.value if s.stop_reason is not None else None,
                "infra_failure": s.infra_failure}

    def _fields(self, outcome: StepOutcome) -> dict[str, Any]:
        status = self._status()
        messages = _safe(outcome.messages)
        return {"messages": messages, "terminated": outcome.terminated,
                "truncated": outcome.truncated, "stop_reason": status["stop_reason"],
                "infra_failure": status["infra_failure"], "info": json_info(outcome.info),
                "reward": outcome.reward, "done": outcome.done or self.session.done,
                "metadata": {**status, "terminated": outcome.terminated,
                             "truncated": outcome.truncated}}


def _parse_action(action: Any) -> tuple[str, str | None, Any, str | None]:
    """``(kind, tool name, arguments, text)`` of any action the env takes."""
    if isinstance(action, ListToolsAction):
        return "list_tools", None, None, None
    if isinstance(action, CallToolAction):
        return "call_tool", action.tool_name, action.arguments, None
    if isinstance(action, str):
        return "message", None, None, action
    if isinstance(action, dict):
        action = SaoGymAction.model_validate(action)
    if isinstance(action, SaoGymAction):
        return action.type, action.tool_name, action.arguments, action.content
    raise TypeError(f"SaoGymOpenEnv takes SaoGymAction, ListToolsAction, CallToolAction or "
                    f"text actions, got {type(action).__name__}")


def _declared_tools(env_id: str) -> list[dict[str, Any]]:
    """The tool schemas a ToolEnv class declares (none for other envs), without an env."""
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    from sao_gym.registration import resolve_id
    from sao_gym.tools import ToolEnv

    entry = gymnasium.spec(resolve_id(env_id)).entry_point
    creator = load_env_creator(entry) if isinstance(entry, str) else entry
    if isinstance(creator, type) and issubclass(creator, ToolEnv):
        return [spec.schema() for spec in creator.tool_specs().values()]
    return []


def _probe(env_id: str, env_kwargs: dict[str, Any]) -> None:
    """Build and close one env, so a bad id or option fails now, in one line."""
    import sao_gym

    async def build() -> None:
        await sao_gym.make(env_id, **env_kwargs).aclose()

    try:
        shared_loop().run(build(), timeout=120)
    except Exception as e:  # noqa: BLE001 - any failure to build is the caller's error
        raise ValueError(f"cannot make env {env_id!r} with {env_kwargs}: "
                         f"{type(e).__name__}: {' '.join(str(e).split())}") from e


def create_app(env_id: str, *, max_concurrent_envs: int = DEFAULT_MAX_SESSIONS,
               session_timeout_s: float | None = None, step_timeout_s: float | None = None,
               **env_kwargs: Any) -> Any:
    """OpenEnv's FastAPI app serving ``env_id`` (built with ``env_kwargs``).

    Args:
        env_id: a registered env id (checked now: a bad id or option raises ``ValueError``).
        max_concurrent_envs: WebSocket sessions at once (each has its own env).
        session_timeout_s: idle sessions are closed after this long (``None``: never).
        step_timeout_s: the most one env step may take (then an infra failure).
        **env_kwargs: constructor options of the env; ``max_episode_steps``
            sets its turn limit.

    """
    _probe(env_id, env_kwargs)
    factory = functools.partial(SaoGymOpenEnv, env_id, step_timeout_s=step_timeout_s,
                                **env_kwargs)
    concurrency = ConcurrencyConfig(max_concurrent_envs=max_concurrent_envs,
                                    session_timeout=session_timeout_s)
    app = openenv_create_app(factory, SaoGymAction, SaoGymObservation, env_name=env_id,
                             concurrency_config=concurrency)
    app.add_middleware(QuietDisconnects)
    return app


class QuietDisconnects:
    """ASGI middleware: a client gone before the server's goodbye is not an error.

    OpenEnv's client closes its socket right after its ``close`` message, and
    OpenEnv's server, closing its side of the finished session, then raises
    ``WebSocketDisconnect``: uvicorn would log "Exception in ASGI application"
    with a traceback for every session of that client.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Pass the request on; swallow a disconnect of a WebSocket session."""
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope.get("type") != "websocket":
                raise


def serve_app(app: Any, host: str = "127.0.0.1", port: int = 8000, *,
              log_level: str = "warning") -> None:
    """Run an app of :func:`create_app` with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level, ws_max_size=WS_MAX_SIZE,
                timeout_graceful_shutdown=5)


def serve_env(env_id: str, host: str = "127.0.0.1", port: int = 8000,
              env_kwargs: dict[str, Any] | None = None,
              max_concurrent_envs: int = DEFAULT_MAX_SESSIONS, *,
              step_timeout_s: float | None = None, log_level: str = "warning") -> None:
    """Serve ``env_id`` over OpenEnv's protocol with uvicorn until interrupted."""
    app = create_app(env_id, max_concurrent_envs=max_concurrent_envs,
                     step_timeout_s=step_timeout_s, **(env_kwargs or {}))
    serve_app(app, host, port, log_level=log_level)
