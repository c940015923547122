"""The core library names no task: no module under sao_gym/ (recipes aside) names a
built-in environment id or a built-in tool name.

What belongs to one environment (its oracle, exporters, graders, task makers)
lives with it under envs/ and reaches the core through its registration's hooks
(``sao_gym.registration.env_hook``).

- An env id counts anywhere in a module's text (code, docstrings, comments),
  with or without its namespace: ``sao_gym/Foo-v0`` and ``Foo-v0``.
- A tool name counts as a string literal equal to it (``"submit"``): the same
  word in prose ("a python program") or as an attribute (the Sandbox
  protocol's own ``read_file`` method) is not a tool. A tool named after a
  program the core names in its own right is left out (:data:`PROGRAMS`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import gymnasium
from gymnasium.envs.registration import load_env_creator, parse_env_id

import sao_gym
from sao_gym.tools import ToolEnv

CORE = Path(sao_gym.__file__).resolve().parent
EXEMPT = CORE / "recipes"
BUILT_IN = ("sao_gym.envs.", "sao_gym.adapters.")
"""Entry points of the environments that ``sao_gym.envs`` registers."""
PROGRAMS = {"python"}
"""Tools named after a program: the core says "python" of the interpreter (the sandboxes'
``python`` link, Python's RNG state in checkpoints), not of the tool that runs it."""


def built_in_ids() -> list[str]:
    ids = []
    for env_id in sao_gym.env_ids():
        entry = gymnasium.spec(env_id).entry_point
        if isinstance(entry, str) and entry.startswith(BUILT_IN):
            ids.append(env_id)
    return ids


def built_in_tools() -> dict[str, list[str]]:
    """Tool name -> the built-in envs that declare it."""
    tools: dict[str, list[str]] = {}
    for env_id in built_in_ids():
        cls = load_env_creator(gymnasium.spec(env_id).entry_point)
        if isinstance(cls, type) and issubclass(cls, ToolEnv):
            for name in set(cls.tool_specs()) - PROGRAMS:
                tools.setdefault(name, []).append(env_id)
    return tools


def core_modules() -> list[Path]:
    return sorted(p for p in CORE.rglob("*.py") if EXEMPT not in p.parents)


def test_the_lists_are_not_empty():
    """Guards the scan below against vacuous passes (a renamed entry point, a lost import)."""
    ids, tools = built_in_ids(), built_in_tools()
    assert len(ids) >= 5 and {"submit", "bash", "read_file"} <= set(tools), (ids, tools)
    assert len(core_modules()) > 20


def test_core_modules_name_no_env_id():
    names = {parse_env_id(i)[1] for i in built_in_ids()}
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, sorted(names))) +
                         r")-v\d+(?!\w)")
    found = []
    for path in core_modules():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(CORE.parent)}:{n}: {m.group(0)}"
                      for m in pattern.finditer(line)]
    assert not found, ("core modules name built-in env ids (move the code to the env's "
                       "folder under envs/, or use a placeholder id):\n" + "\n".join(found))


def test_core_modules_name_no_tool():
    tools = built_in_tools()
    found = []
    for path in core_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value in tools:
                found.append(f"{path.relative_to(CORE.parent)}:{node.lineno}: "
                             f"{node.value!r} (a tool of {', '.join(tools[node.value])})")
    assert not found, ("core modules name built-in tools as strings (move the code to the "
                       "env's folder under envs/):\n" + "\n".join(found))


def test_core_modules_import_no_env_module():
    """An env's code reaches the core through its registration's hooks, never an import
    (``sao_gym/__init__.py`` imports ``sao_gym.envs`` for the registrations alone)."""
    found = []
    for path in core_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(CORE.parent)}:{node.lineno}: {name}"
                      for name in names if name.startswith("sao_gym.envs.")]
    assert not found, ("core modules import env modules (reach them through a hook, "
                       "sao_gym.registration.env_hook):\n" + "\n".join(found))
