"""Parse tool calls out of generated text.

Two formats, tried in order:

1. Hermes/Qwen blocks: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
   (several per message; an unclosed block at the end of the text counts, so
   a generation cut by ``max_new_tokens`` still yields its call).
2. Plain-text fallback, when no block is present: a bare JSON object
   ``{"name": ..., "arguments": {...}}`` naming a known tool, or a line
   ``name(argument)`` naming a known tool, whose single argument goes to the
   tool's first required parameter (``submit(42)``, ``calculator(3*(4+5))``),
   as the JSON type the parameter declares when it parses as one (``42`` for
   an integer parameter, ``"42"`` for a string one). A tool with several
   parameters takes comma-separated arguments in the order its schema lists
   them (the order the compact chat template shows: ``add(a, b)``), or by
   name: ``add(7, 12)``, ``add(b=12, a=7)``; commas inside quotes or
   brackets do not split.

A block whose JSON is broken still becomes a tool call (with the raw text as
``arguments``) so the environment can tell the agent what went wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sao_gym.types import ToolCall

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')


def _first_param(schema: Mapping[str, Any]) -> str | None:
    params = schema.get("function", schema).get("parameters", {})
    required = params.get("required") or list(params.get("properties", {}))
    return required[0] if required else None


def _typed(arg: str, schema: Mapping[str, Any], param: str) -> Any:
    """``arg`` (the text of a plain-text call) as the JSON type its parameter declares.

    ``guess(42)`` for an integer parameter passes 42, not "42"; text that is not
    of the declared type stays a string, so the env's schema check answers it.
    """
    params = schema.get("function", schema).get("parameters", {})
    kind = params.get("properties", {}).get(param, {}).get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if "string" in kinds or kind is None:
        return arg
    try:
        value = json.loads(arg)
    except (ValueError, RecursionError):
        return arg
    wanted = {"integer": int, "number": (int, float), "boolean": bool, "object": dict,
              "array": list, "null": type(None)}
    ok = any(isinstance(value, wanted[k]) and not (k in ("integer", "number") and
                                                   isinstance(value, bool))
             for k in kinds if k in wanted)
    return value if ok else arg


def _call(name: str, arguments: Any, index: int, prefix: str) -> ToolCall:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": f"{prefix}{index}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _from_json_text(text: str) -> tuple[str, Any] | None:
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    return obj["name"], obj.get("arguments", obj.get("parameters", {}))


def parse_tool_calls(
    text: str, tools: Sequence[Mapping[str, Any]] = (), *, id_prefix: str = "call_"
) -> tuple[str, list[ToolCall]]:
    """Split generated ``text`` into (content, tool calls).

    ``tools`` are the OpenAI schemas from the env's reset info; they enable the
    plain-text fallback. Content is the text outside tool-call blocks, stripped.
    """
    blocks = _BLOCK.findall(text)
    if blocks:
        calls = []
        for i, block in enumerate(blocks):
            parsed = _from_json_text(block.strip())
            if parsed is None:
                name = _NAME.search(block)
                parsed = (name.group(1) if name else "", block.strip())
            calls.append(_call(parsed[0], parsed[1], i, id_prefix))
        return _BLOCK.sub("", text).strip(), calls
    return _plain_text_calls(text, tools, id_prefix)


def _plain_text_calls(
    text: str, tools: Sequence[Mapping[str, Any]], id_prefix: str
) -> tuple[str, list[ToolCall]]:
    by_name = {t.get("function", t).get("name"): t for t in tools}
    if not by_name:
        return text.strip(), []
    stripped = text.strip()
    parsed = _from_json_text(stripped)
    if parsed is not None and parsed[0] in by_name:
        return "", [_call(parsed[0], parsed[1], 0, id_prefix)]
    names = "|".join(re.escape(n) for n in by_name if n)
    pattern = re.compile(rf"^\s*({names})\((.*)\)\s*$", re.MULTILINE)
    calls, kept = [], []
    for line in text.splitlines():
        m = pattern.match(line)
        if not m:
            kept.append(line)
            continue
        name, arg = m.group(1), m.group(2).strip()
        calls.append(_call(name, _arguments(arg, by_name[name]), len(calls), id_prefix))
    return "\n".join(kept).strip(), calls


def _unquoted(arg: str) -> str:
    arg = arg.strip()
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "\"'":
        return arg[1:-1]
    return arg


def _split_arguments(text: str) -> list[str]:
    """``text`` cut at the commas outside quotes and brackets."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def _arguments(arg: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of a plain-text call ``name(arg)`` (module docs)."""
    props = list(schema.get("function", schema).get("parameters", {}).get("properties", {}))
    param = _first_param(schema)
    parts = _split_arguments(arg) if len(props) > 1 else [arg]
    if not 1 < len(parts) <= len(props):  # one argument: the first required parameter
        return {param: _typed(_unquoted(arg), schema, param)} if param else {}
    out: dict[str, Any] = {}
    positional = iter(props)
    for part in parts:
        key, eq, value = part.partition("=")
        if eq and key.strip() in props:
            name, text = key.strip(), value
        else:
            name = next((p for p in positional if p not in out), None)
            text = part
            if name is None:
                return {param: _typed(_unquoted(arg), schema, param)}
        out[name] = _typed(_unquoted(text), schema, name)
    return out
