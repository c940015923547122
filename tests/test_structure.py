"""The package's shape: no import circle, one reader of the config, actors built from factories.

- no circle among the package's modules, counting every import (module-level
  and inside functions, ``from pkg import submodule`` as an import of the
  submodule);
- ``runtime/build.py`` (the one reader of the config) imports nothing of the
  runtimes that place the parts (``runtime/ray``, ``runtime/local``);
- the run's parts are picklable factories that hold no config object, and
  no Ray actor class takes a config.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pickle
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"sao_gym": "sao_gym", "envs": "sao_gym.envs", "agents": "sao_gym.agents"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, name in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
            found |= subs
            if len(subs) < len(node.names):  # names of the module itself
                found.add(node.module)
    return found & modules.keys()


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_anywhere_in_the_package():
    modules = _modules()
    graph = {m: _imports(p, modules) - {m} for m, p in modules.items()}
    assert len(graph) > 100  # the whole package was read
    assert _circles(graph) == []
    # the check finds one when there is one
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_builder_imports_no_runtime():
    modules = _modules()
    imported = _imports(ROOT / "sao_gym" / "runtime" / "build.py", modules)
    assert not {m for m in imported if m.startswith(("sao_gym.runtime.ray",
                                                     "sao_gym.runtime.local"))}, imported


def _holds_a_config(obj, seen=None) -> list[str]:
    """Paths inside ``obj`` (dataclasses, mappings, sequences) to a runtime config object."""
    from sao_gym.runtime import config as config_module

    configs = tuple(c for c in vars(config_module).values()
                    if isinstance(c, type) and dataclasses.is_dataclass(c)
                    and c.__module__ == config_module.__name__ and c.__name__ != "RayConfig")
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, configs):
        return [type(obj).__name__]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    elif isinstance(obj, dict):
        children = {str(k): v for k, v in obj.items()}
    elif isinstance(obj, (list, tuple)):
        children = {str(i): v for i, v in enumerate(obj)}
    else:
        return []
    return [f"{k}.{p}" for k, v in children.items() for p in _holds_a_config(v, seen)]


@pytest.mark.parametrize("overrides", [
    [],
    ["runtime=ray", "inference.backend=vllm_server", "inference.launch=2",
     "rollout.max_new_tokens=8", "rollout.max_context_tokens=64"],
    ["algorithm=grpo", "rollout.group_size=4"],
])
def test_the_run_parts_are_picklable_factories_without_a_config(overrides):
    from sao_gym.runtime.build import run_parts
    from sao_gym.runtime.loader import load_recipe

    config = load_recipe("demo", overrides)
    parts = run_parts(config)
    assert _holds_a_config(parts) == []
    assert _holds_a_config(config) != []  # the check sees a config where there is one
    again = pickle.loads(pickle.dumps(parts))
    assert again == parts
    assert parts.rollouts.env.env_id == config.env
    assert parts.learner.algorithm == config.algorithm
    if config.runtime == "ray":
        assert parts.rollouts.backend.share(1, 2).launch == 1


def test_no_ray_actor_class_takes_a_config():
    from sao_gym.runtime.ray.learner import LearnerService
    from sao_gym.runtime.ray.servers import ServerActor
    from sao_gym.runtime.ray.worker import RolloutWorker, WorkerSpec

    for cls in (LearnerService, RolloutWorker, ServerActor):
        params = inspect.signature(cls.__init__).parameters
        assert not [p for p in params if "config" in p.lower()], cls
    assert not [f.name for f in dataclasses.fields(WorkerSpec) if "config" in f.name]
