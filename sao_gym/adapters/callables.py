"""JSON-schema tools as typed Python callables.

TRL (through ``transformers.utils.get_json_schema``), FastMCP and the MCP SDK
learn a tool from a Python function: its name, its signature's type hints and
a Google-style docstring (a description, then ``Args:`` with one line per
argument). Our environments declare tools the other way round, as OpenAI
function schemas (``info["tools"]``). :func:`tool_function` turns such a
schema into a function those libraries read back as the same schema:

- JSON types become hints (``string`` -> ``str``, ``integer`` -> ``int``,
  ``number`` -> ``float``, ``boolean`` -> ``bool``, ``array`` of X ->
  ``list[X]``, ``object`` -> ``dict``, a list of types -> a ``Union``, no
  type -> ``Any``); required arguments have no default, optional ones default
  to ``None`` (and are not passed on when left out);
- descriptions go in the docstring, ``enum`` as the ``(choices: [...])`` suffix
  ``get_json_schema`` reads.

The function forwards whatever keyword arguments it gets, as a dict, to a
handler, without checking them: the environment validates arguments against
its own schema, so a wrong or unexpected argument becomes the env's error
message, not a ``TypeError``.

What a signature cannot carry is lost on the way (documented per adapter in
docs/interop.md): ``additionalProperties: false`` (the env still enforces
it), JSON-schema keywords other than ``type``/``items``/``enum``/
``description`` (``minimum``, ``pattern``, ...), and the order of a type
list (``get_json_schema`` sorts it). :func:`comparable` normalises a schema
for those differences; :func:`signature_schema` is the schema such a library
reads back, which is what it puts in the prompt (an agent shows its model that
form with ``rollout.tool_schemas: signature``).
"""

from __future__ import annotations

import copy
import inspect
import json
import keyword
import types
from collections.abc import Callable
from typing import Any, Union

_SIMPLE: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool,
                           "null": type(None)}


def function_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The ``{"name", "description", "parameters"}`` part of an OpenAI tool schema."""
    fn = schema.get("function", schema) if isinstance(schema, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError(f"not a function tool schema: {str(schema)[:200]}")
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise ValueError(f"tool {fn['name']!r}: parameters must be a JSON object schema")
    return {"name": fn["name"], "description": fn.get("description") or "", "parameters": params}


def python_type(prop: dict[str, Any]) -> Any:
    """The type hint ``get_json_schema`` maps back to the JSON schema ``prop``."""
    kind = prop.get("type")
    if kind is None:
        return Any
    if isinstance(kind, list):
        hints = [python_type({**prop, "type": k}) for k in kind if k != "null"]
        hint = Union[tuple(hints)] if hints else type(None)  # noqa: UP007 - built at run time
        return hint | None if "null" in kind and hints else hint
    if kind in _SIMPLE:
        return _SIMPLE[kind]
    if kind == "array":
        items = prop.get("items")
        return list[python_type(items)] if isinstance(items, dict) and items else list
    if kind == "object":
        extra = prop.get("additionalProperties")
        return dict[str, python_type(extra)] if isinstance(extra, dict) and extra else dict
    return Any


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def docstring(description: str, params: dict[str, Any], names: list[str]) -> str:
    """A Google-style docstring of a tool (see module docs)."""
    lines = [_one_line(description) if description.strip() else "A tool."]
    if names:
        lines += ["", "Args:"]
        for name in names:
            prop = params.get(name) or {}
            desc = _one_line(prop.get("description") or name)
            if isinstance(prop.get("enum"), list):
                desc += f" (choices: {json.dumps(prop['enum'], ensure_ascii=False)})"
            lines.append(f"    {name}: {desc}")
    return "\n".join(lines)


def tool_function(schema: dict[str, Any], handler: Callable[..., Any], *,
                  method: bool = False) -> types.FunctionType:
    """A function with ``schema``'s name, typed signature and docstring (see module docs).

    Calling it with keyword arguments calls ``handler(name, arguments)`` (with
    ``method=True`` the function takes ``self`` first and calls
    ``handler(self, name, arguments)``, for use as a class attribute) and
    returns what the handler returns. Optional arguments left at ``None`` are
    not in ``arguments`` unless their schema allows null.
    """
    fn_schema = function_schema(schema)
    name, params = fn_schema["name"], fn_schema["parameters"]
    props: dict[str, Any] = params.get("properties") or {}
    required = [r for r in params.get("required") or [] if isinstance(r, str)]
    names = list(props) + [r for r in required if r not in props]
    for arg in names:
        if not arg.isidentifier() or keyword.iskeyword(arg):
            raise ValueError(f"tool {name!r}: argument {arg!r} is not a Python parameter name, "
                             "so the tool cannot be a Python function")
    nullable = {a for a in names if _allows_null(props.get(a) or {})}
    optional = {a for a in names if a not in required}

    def given(kwargs: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in kwargs.items()
                if not (v is None and k in optional and k not in nullable)}

    if method:
        def fn(self: Any, **kwargs: Any) -> Any:
            return handler(self, name, given(kwargs))
    else:
        def fn(**kwargs: Any) -> Any:
            return handler(name, given(kwargs))

    hints = {a: python_type(props.get(a) or {}) for a in names}
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] \
        if method else []
    parameters += [inspect.Parameter(a, inspect.Parameter.KEYWORD_ONLY, annotation=hints[a],
                                     default=inspect.Parameter.empty if a in required else None)
                   for a in names]
    fn.__name__ = fn.__qualname__ = name
    fn.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    fn.__annotations__ = hints
    fn.__doc__ = docstring(fn_schema["description"], props, names)
    return fn


def signature_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as a library that learns tools from Python functions renders it.

    transformers' ``get_json_schema`` of the :func:`tool_function` of
    ``schema``: the tool schema TRL's GRPOTrainer (and any caller of
    ``apply_chat_template(tools=[functions])``) writes into the prompt, without
    what a signature cannot carry. Raises ``ValueError`` for a tool that
    cannot be a Python function.
    """
    from transformers.utils import get_json_schema

    return get_json_schema(tool_function(schema, _unused_handler))


def _unused_handler(*_: Any) -> Any:  # pragma: no cover - never called
    raise RuntimeError("a signature schema's function is not for calling")


def _allows_null(prop: dict[str, Any]) -> bool:
    kind = prop.get("type")
    return kind is None or kind == "null" or (isinstance(kind, list) and "null" in kind)


def comparable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without what a Python signature cannot carry (see module docs).

    Drops a top-level ``additionalProperties: false`` and a ``return`` entry,
    sorts type lists and ``required``, and writes ``nullable: true`` as a
    ``"null"`` type, so that a tool's schema and the one a library derives
    from its :func:`tool_function` compare equal when nothing else differs.
    """
    fn = copy.deepcopy(function_schema(schema))
    params = fn["parameters"]
    if params.get("additionalProperties") is False:
        del params["additionalProperties"]
    if "required" in params:
        params["required"] = sorted(params["required"])
        if not params["required"]:
            del params["required"]
    params.setdefault("properties", {})
    params["properties"] = {k: _normal(v) for k, v in params["properties"].items()}
    return {"type": "function", "function": fn}


def _normal(prop: Any) -> Any:
    if not isinstance(prop, dict):
        return prop
    out = {k: _normal(v) if k in ("items", "additionalProperties") else v
           for k, v in prop.items() if k != "nullable"}
    kinds = out.get("type")
    if prop.get("nullable") and kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        kinds.append("null")
    if isinstance(kinds, list):
        kinds = sorted(set(kinds))
        out["type"] = kinds[0] if len(kinds) == 1 else kinds
    if "anyOf" in out:
        out["anyOf"] = [_normal(p) for p in out["anyOf"]]
    return out
