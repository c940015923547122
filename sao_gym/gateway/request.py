"""An OpenAI chat-completions request body, checked into a :class:`ChatRequest`.

Supported: ``model``, ``messages`` (system, user, assistant with
``tool_calls``, tool), ``tools`` (function tools), ``tool_choice`` ``auto`` or
``none``, ``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens``,
``seed``, ``stop`` (up to 4 strings: the reply ends before the first, and the
record keeps the sampled tokens up to the one completing it), ``logprobs`` (the
sampled token's; ``top_logprobs`` 0), ``n`` 1,
``stream`` (with ``stream_options.include_usage``), ``parallel_tool_calls``
true, ``user`` and ``metadata`` (recorded nowhere, change nothing), and vLLM's
``return_token_ids``. Anything else is a :class:`GatewayError` naming the
field, answered in OpenAI's error shape (``{"error": {"message", "type",
"param", "code"}}``), so a harness never believes a setting took effect when
it did not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sao_gym.types import ROLES, Message

SUPPORTED = frozenset({"model", "messages", "tools", "tool_choice", "temperature", "top_p",
                       "max_tokens", "max_completion_tokens", "seed", "stop", "logprobs",
                       "top_logprobs", "n", "stream", "stream_options", "parallel_tool_calls",
                       "user", "metadata", "return_token_ids"})
"""The request fields the gateway reads (module docs)."""


class GatewayError(ValueError):
    """A request the gateway refuses: HTTP ``status`` with OpenAI's error body."""

    def __init__(self, message: str, *, param: str | None = None,
                 code: str = "invalid_value", status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param, self.code, self.status, self.kind = param, code, status, kind

    def body(self) -> dict[str, Any]:
        """OpenAI's error shape."""
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class ChatRequest:
    """What a chat-completions call asks for."""

    messages: list[Message]
    """The conversation so far (OpenAI format, ``content`` text)."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Function tools, as the chat template renders them."""
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    """Most tokens to sample (None: the context's room)."""
    seed: int | None = None
    logprobs: bool = False
    """Return each sampled token's logprob."""
    stream: bool = False
    include_usage: bool = False
    """With ``stream``: a last chunk with the token counts."""
    return_token_ids: bool = False
    """Return the prompt's and the completion's token ids (vLLM's field names)."""
    tool_choice: str = "auto"
    """``auto``: tool calls are parsed from the reply; ``none``: it is text only."""
    stop: tuple[str, ...] = ()
    """Stop strings (the reply ends before the first it contains)."""


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise GatewayError(f"{name} must be a number in [{low}, {high}], got {value!r}",
                           param=name)
    return float(value)


def _messages(value: Any) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise GatewayError("messages must be a non-empty list of messages", param="messages")
    out: list[Message] = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in (*ROLES, "developer"):
            raise GatewayError(f"{where} must be an object with a role of {list(ROLES)}",
                               param=where)
        m = dict(m)  # the body's own: its nested parts are read, never changed
        if m["role"] == "developer":  # OpenAI's newer name of the system role
            m["role"] = "system"
        content = m.get("content")
        if isinstance(content, list):  # text parts only
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                raise GatewayError(f"{where}.content: only text parts are supported",
                                   param=f"{where}.content", code="unsupported_value")
            m["content"] = "".join(p["text"] for p in content)
        elif content is not None and not isinstance(content, str):
            raise GatewayError(f"{where}.content must be text", param=f"{where}.content")
        calls = m.get("tool_calls")
        if calls is not None:
            if m["role"] != "assistant" or not isinstance(calls, list) or not all(
                    isinstance(c, dict) and isinstance(c.get("function"), dict)
                    and isinstance(c["function"].get("name"), str) for c in calls):
                raise GatewayError(f"{where}.tool_calls must be an assistant's list of "
                                   "function calls", param=f"{where}.tool_calls")
            if not calls:
                del m["tool_calls"]
        if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise GatewayError(f"{where}: a tool message needs its tool_call_id",
                               param=f"{where}.tool_call_id")
        out.append(m)
    return out


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
            isinstance(t, dict) and t.get("type") == "function"
            and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in value):
        raise GatewayError("tools must be a list of function tools "
                           '({"type": "function", "function": {"name": ...}})', param="tools")
    return list(value)


def parse_chat_request(body: Any, *, models: tuple[str, ...]) -> ChatRequest:
    """The :class:`ChatRequest` of a chat-completions ``body``, or :class:`GatewayError`.

    ``models``: the names the body's ``model`` may take.
    """
    if not isinstance(body, dict):
        raise GatewayError("the request body must be a JSON object")
    unknown = sorted(set(body) - SUPPORTED)
    if unknown:
        raise GatewayError(f"unsupported parameter(s) {unknown}: this gateway supports "
                           f"{sorted(SUPPORTED)}", param=unknown[0],
                           code="unsupported_parameter")
    if body.get("model") not in models:
        raise GatewayError(f"model {body.get('model')!r} is not served here (serving "
                           f"{list(models)})", param="model", code="model_not_found",
                           status=404)
    if body.get("n", 1) not in (1, None):
        raise GatewayError("n must be 1 (one rollout per call)", param="n",
                           code="unsupported_value")
    if body.get("top_logprobs") not in (None, 0):
        raise GatewayError("top_logprobs must be 0: only the sampled token's logprob is "
                           "returned", param="top_logprobs", code="unsupported_value")
    if body.get("parallel_tool_calls") not in (None, True):
        raise GatewayError("parallel_tool_calls must be true: every tool call of a reply is "
                           "parsed", param="parallel_tool_calls", code="unsupported_value")
    choice = body.get("tool_choice")
    choice = "auto" if choice is None else choice
    if choice not in ("auto", "none"):
        raise GatewayError("tool_choice must be 'auto' or 'none'", param="tool_choice",
                           code="unsupported_value")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise GatewayError(f"max_tokens must be an integer >= 1, got {limit!r}",
                           param="max_tokens")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise GatewayError(f"seed must be an integer, got {seed!r}", param="seed")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else ([] if stop is None else stop)
    if not isinstance(stop, list) or len(stop) > 4 or not all(
            isinstance(x, str) and x for x in stop):
        raise GatewayError("stop must be a non-empty string or a list of up to 4 of them",
                           param="stop")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict)
                                or set(options) - {"include_usage"}):
        raise GatewayError("stream_options supports include_usage only",
                           param="stream_options", code="unsupported_value")
    flags = {}
    for name in ("logprobs", "stream", "return_token_ids"):
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise GatewayError(f"{name} must be true or false, got {value!r}", param=name)
        flags[name] = bool(value)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    return ChatRequest(
        messages=_messages(body.get("messages")), tools=_tools(body.get("tools")),
        temperature=temperature, top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
        max_tokens=limit, seed=seed, tool_choice=choice,
        include_usage=bool((options or {}).get("include_usage")), stop=tuple(stop), **flags)


__all__ = ["SUPPORTED", "ChatRequest", "GatewayError", "parse_chat_request"]
