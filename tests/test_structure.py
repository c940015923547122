"""The package's shape: no import circle, one reader of the config, actors built from factories.

- no circle among the package's modules, counting every import (module-level
  and inside functions, ``from pkg import submodule`` as an import of the
  submodule);
- ``runtime/config/build.py`` (the one reader of the config) imports nothing of the
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
    imported = _imports(ROOT / "sao_gym" / "runtime" / "config" / "build.py", modules)
    assert not {m for m in imported if m.startswith("sao_gym.runtime.place")}, imported


def _holds_a_config(obj, seen=None) -> list[str]:
    """Paths inside ``obj`` (dataclasses, mappings, sequences) to a runtime config object."""
    from sao_gym.runtime.config import schema as config_module

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
    from sao_gym.runtime.config.build import run_parts
    from sao_gym.runtime.config.loader import load_recipe

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
    from sao_gym.runtime.place.ray.learner import LearnerService
    from sao_gym.runtime.place.ray.servers import ServerActor
    from sao_gym.runtime.place.ray.worker import RolloutWorker, WorkerSpec

    for cls in (LearnerService, RolloutWorker, ServerActor):
        params = inspect.signature(cls.__init__).parameters
        assert not [p for p in params if "config" in p.lower()], cls
    assert not [f.name for f in dataclasses.fields(WorkerSpec) if "config" in f.name]


# ---------------------------------------------------------------- one reader of the config

READERS = {"sao_gym.runtime.config.schema", "sao_gym.runtime.config.loader",
           "sao_gym.runtime.config.build"}
"""The modules that may read a TrainConfig's fields: the schema, the loader, the builder."""

CONFIG_NAMES = {"config", "cfg", "conf", "train_config", "base"}
"""Names a config is held under."""


def _train_config_fields() -> tuple[set[str], dict[str, set[str]]]:
    """TrainConfig's own fields and properties (those no other config record has), and
    the fields of its sections that only it has (``rollout``, ``warm_start``, ...)."""
    from sao_gym.inference.sections import SECTIONS
    from sao_gym.learner.config import LearnerConfig
    from sao_gym.runtime.config import schema

    def names(cls) -> set[str]:
        return ({f.name for f in dataclasses.fields(cls)}
                | {n for n, v in vars(cls).items() if isinstance(v, property)})

    others = names(LearnerConfig) | names(schema.RayConfig)
    for section in SECTIONS.values():
        others |= names(section)
    own = names(schema.TrainConfig) - others | {"to_dict"}
    sections = {"rollout": names(schema.RolloutConfig),
                "warm_start": names(schema.WarmStartConfig),
                "checkpoint": names(schema.CheckpointConfig),
                "logging": names(schema.LoggingConfig)}
    return own, sections


def _config_reads(path: Path, own: set[str], sections: dict[str, set[str]]) -> list[str]:
    """Where ``path``'s code names TrainConfig or reads a config's fields (``line: what``)."""
    tree = ast.parse(path.read_text())
    other = set()  # (function, name) of parameters typed as another record
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for a in fn.args.args + fn.args.kwonlyargs:
                if a.annotation is not None and "TrainConfig" not in ast.unparse(a.annotation):
                    other.update((node, a.arg) for node in ast.walk(fn))
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name) and node.id == "TrainConfig" or (
                isinstance(node, ast.Attribute) and node.attr == "TrainConfig") or (
                isinstance(node, ast.alias) and node.name == "TrainConfig"):
            found.append(f"{line}: TrainConfig")
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if (isinstance(base, ast.Name) and base.id in CONFIG_NAMES and node.attr in own
                and (node, base.id) not in other):
            found.append(f"{line}: {base.id}.{node.attr}")
        if (isinstance(base, ast.Attribute) and base.attr in sections
                and node.attr in sections[base.attr]):
            found.append(f"{line}: .{base.attr}.{node.attr}")
    return found


def test_no_module_but_the_builder_reads_the_config():
    own, sections = _train_config_fields()
    modules = _modules()
    assert {"env", "model", "warm_start", "total_steps", "mode", "to_dict"} <= own
    readers = {name: _config_reads(path, own, sections) for name, path in modules.items()
               if name not in READERS}
    assert {name: where for name, where in readers.items() if where} == {}
    # the check sees reads where there are some
    assert _config_reads(modules["sao_gym.runtime.config.build"], own, sections)
    sample = ROOT / "tests" / "_config_reads_sample.py"
    sample.write_text("def f(config, plan):\n    return (config.env, plan.warm_start.steps, "
                      "plan.env, plan.eval.episodes)\n")
    try:
        assert _config_reads(sample, own, sections) == ["2: config.env",
                                                        "2: .warm_start.steps"]
    finally:
        sample.unlink()


class _ConfigCalls:
    """A tracer: every function of the package called with a TrainConfig argument.

    A global trace function sees each Python call once and, returning None,
    traces no line of it (cheaper than a profiler, which also sees C calls).
    """

    def __init__(self):
        from sao_gym.runtime.config.schema import TrainConfig

        self.config_type, self.seen = TrainConfig, set()

    def __call__(self, frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if event != "call" or not module.startswith("sao_gym"):
            return
        code = frame.f_code
        args = [frame.f_locals.get(n) for n in code.co_varnames[:code.co_argcount
                                                                + code.co_kwonlyargcount]]
        if any(isinstance(a, self.config_type) for a in args):
            self.seen.add((module, code.co_name))

    def __enter__(self):
        import sys

        sys.settrace(self)
        return self

    def __exit__(self, *exc):
        import sys

        sys.settrace(None)


def test_the_cli_hands_the_config_to_the_builder_and_then_only_records(
        tmp_path, tiny_model_path, monkeypatch, capsys):
    """`sao-gym train` and `sao-gym eval`, followed call by call: the only functions that
    receive the config are the schema's, the loader's and the builder's."""
    from sao_gym.cli import main
    from sao_gym.runtime import job
    from tests.runtime.fakes import fake_trainer

    trainers = [fake_trainer(2)]
    monkeypatch.setattr(job, "place", lambda *a, **k: trainers[-1])
    monkeypatch.setattr(job, "_plots", lambda run_dir: [])
    run = tmp_path / "run"
    train = ["train", "--set", "env=sao_gym/Arithmetic-v0", "--set", "warm_start=null",
             "--set", f"model={tiny_model_path}", "--set", "eval.episodes=2",
             "--set", "total_steps=2", "--set", "rollout.max_new_tokens=null",
             "--set", "rollout.concurrency=2", "--out", str(run)]
    with _ConfigCalls() as calls:
        assert main(train) == 0
    assert calls.seen and {m for m, _ in calls.seen} <= READERS, sorted(calls.seen)
    assert ("sao_gym.runtime.config.build", "train_plan") in calls.seen
    assert "rollout.max_new_tokens = 256" in capsys.readouterr().err  # fitted on the way
    checkpoint = run / "checkpoints" / "step_0000002" / "policy"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.symlink_to(tiny_model_path)
    (checkpoint.parent / "trainer.json").write_text('{"step": 2, "next_seed": 4}')
    with _ConfigCalls() as calls:
        assert main(["eval", "--run", str(run), "--episodes", "1"]) == 0
    assert calls.seen and {m for m, _ in calls.seen} <= READERS, sorted(calls.seen)
    assert ("sao_gym.runtime.config.build", "eval_plan") in calls.seen


@pytest.mark.parametrize("overrides", [
    [],
    ["warm_start.label_smoothing=null", "rollout.max_new_tokens=null"],
    ["runtime=ray", "inference.backend=vllm_server", "inference.launch=2",
     "rollout.max_new_tokens=8", "rollout.max_context_tokens=64"],
])
def test_the_plans_are_records_without_a_config(overrides):
    from sao_gym.runtime.config.build import train_plan
    from sao_gym.runtime.config.loader import load_recipe

    plan = train_plan(load_recipe("demo", overrides))
    assert _holds_a_config(plan) == []
    assert plan.prepare.sft is not None and plan.prepare.demonstrations is not None
    assert plan.parts.rollouts.env == plan.eval.rollouts.env == plan.prepare.env
