"""Reading configs: YAML files, shipped recipes and ``--set`` overrides into a :class:`TrainConfig`.

``load_config(path, overrides)`` validates everything at once: an unknown
key or a value of the wrong type fails with a :class:`ConfigError` naming
the valid keys (and, for a key that moved into a section, where it lives
now). Values are typed by the schema (:mod:`sao_gym.runtime.config.schema`):
``2e-4`` is a float wherever a float is expected, from YAML as from
``--set``. ``mode: sync`` is the spelling of ``rollout.max_staleness: 0``.

Example:
    >>> cfg = load_config(None, ["total_steps=20", "rollout.batch_size=2", "learner.lr=1e-4"])
    >>> cfg.total_steps, cfg.rollout.batch_size, cfg.learner.lr
    (20, 2, 0.0001)
    >>> try:
    ...     load_config(None, ["batch_size=2"])
    ... except ConfigError as e:
    ...     print(e)
    unknown key 'batch_size' (did you mean 'rollout.batch_size'?)

"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sao_gym.inference.sections import SECTIONS
from sao_gym.runtime.config.schema import MODES, RECIPES_DIR, ConfigError, TrainConfig


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if origin is tuple:
        return isinstance(value, (list, tuple))
    return True


def _section(hint: Any) -> tuple[type | None, bool]:
    """``(dataclass, nullable)`` when ``hint`` is a component section, else ``(None, False)``.

    The inference section is one of several (:data:`SECTIONS`, by ``backend``):
    its "class" is the table, resolved by :func:`_chosen`.
    """
    if dataclasses.is_dataclass(hint):
        return hint, False
    if set(typing.get_args(hint)) == set(SECTIONS.values()):
        return SECTIONS, False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        classes = [a for a in args if dataclasses.is_dataclass(a)]
        if len(classes) == 1 and type(None) in args:
            return classes[0], True
    return None, False


def _chosen(data: Mapping[str, Any], where: str) -> type:
    """The inference section ``data["backend"]`` names (default ``hf``).

    Keys of another backend's section are refused, naming the backend they belong to.
    """
    backend = data.get("backend", "hf")
    if backend not in SECTIONS:
        raise ConfigError(f"{where}backend must be one of {tuple(SECTIONS)}, got {backend!r}")
    cls = SECTIONS[backend]
    own = {f.name for f in dataclasses.fields(cls)}
    for key in sorted(set(data) - own):
        others = [b for b, c in SECTIONS.items()
                  if key in {f.name for f in dataclasses.fields(c)}]
        if others:
            raise ConfigError(f"{where}{key} is a key of inference.backend "
                              f"{' or '.join(others)}, not {backend} (whose keys are "
                              f"{sorted(own)})")
    return cls


def _suggest(key: str) -> str:
    """A hint for a top-level key that lives in a section now."""
    for name, hint in typing.get_type_hints(TrainConfig).items():
        cls, _ = _section(hint)
        if cls is None:
            continue
        classes = cls.values() if cls is SECTIONS else [cls]
        fields = {f.name for c in classes for f in dataclasses.fields(c)}
        rest = key[len(name) + 1:] if key.startswith(name + "_") else key  # warm_start_steps
        if rest in fields:
            return f" (did you mean '{name}.{rest}'?)"
    return ""


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(_unknown_keys_message(unknown, fields, where))
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        section, nullable = _section(hint)
        if section is not None:
            if value is None and nullable:
                kwargs[key] = None
                continue
            if not isinstance(value, Mapping):
                name = getattr(section, "__name__", "section")
                raise ConfigError(f"{where}{key} must be a mapping of {name} fields"
                                  + (" or null" if nullable else ""))
            if section is SECTIONS:
                section = _chosen(value, f"{where}{key}.")
            value = _build(section, value, f"{where}{key}.")
        elif isinstance(value, str) and _wants_float(value, hint):
            value = float(value)  # YAML 1.1 reads 2e-4 (no dot) as a string; --set does not
        elif not _type_ok(value, hint):
            raise ConfigError(f"bad value for {where}{key}: expected {_hint_name(hint)}, "
                              f"got {value!r}")
        elif _accepts_float(hint) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"invalid {where.rstrip('.') or 'train'} config: {e}") from None


def _unknown_keys_message(unknown: list[str], fields: set[str], where: str) -> str:
    """Every unknown top-level key that lives in a section now gets its own hint."""
    hints = {k: _suggest(k) for k in unknown} if not where else {}
    if unknown and all(hints.get(k) for k in unknown):
        listed = ", ".join(f"'{k}'{hints[k]}" for k in unknown)
        return f"unknown key{'s' if len(unknown) > 1 else ''} {listed}"
    message = (f"unknown key(s) {[where + k for k in unknown]}; valid keys: "
               f"{[where + k for k in sorted(fields)]}")
    hinted = [f"'{k}'{hints[k]}" for k in unknown if hints.get(k)]
    return message + (f"; {', '.join(hinted)}" if hinted else "")


def _wants_float(text: str, hint: Any) -> bool:
    """``text`` is a finite number written as a string where ``hint`` takes a float, not a str."""
    return _type_ok(0.5, hint) and not _type_ok(text, hint) and _looks_numeric(text)


def _accepts_float(hint: Any) -> bool:
    if hint is float:
        return True
    args = typing.get_args(hint) if typing.get_origin(hint) in (
        typing.Union, types.UnionType) else ()
    return float in args and int not in args


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"learner.lr=1e-4"`` -> ``(["learner", "lr"], 0.0001)`` (values parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"--set expects key=value, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and _looks_numeric(value):
        value = float(value)
    return key.strip().split("."), value


def _looks_numeric(text: str) -> bool:
    """A finite float written as text (``2e-4``); nan, +-inf and overflows (``1e999``) are not."""
    try:
        value = float(text)
    except ValueError:
        return False
    return abs(value) < float("inf")


def recipe_path(name: str) -> Path:
    """The YAML file of a recipe shipped with the package (``demo`` -> ``recipes/demo.yaml``)."""
    path = RECIPES_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
        raise ConfigError(f"no recipe {name!r}; shipped recipes: {known}")
    return path


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read ``path`` (YAML, optional; None: library defaults), apply overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path} must hold a mapping of config keys")
        data = loaded
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for k in keys[:-1]:
            if node.get(k) is None:
                node[k] = {}
            node = node[k]
            if not isinstance(node, dict):
                raise ConfigError(f"cannot set {text!r}: {k} is not a mapping")
        node[keys[-1]] = value
    return _build(TrainConfig, _spell_mode(data), "")


def _spell_mode(data: dict[str, Any]) -> dict[str, Any]:
    """``mode: sync`` sets ``rollout.max_staleness: 0``; ``mode: async`` needs a bound >= 1.

    Sync wins over whatever else set the bound (a recipe's bound and ``--set
    mode=sync`` give 0). The bound is the one truth: :attr:`TrainConfig.mode`
    reads it back.
    """
    if "mode" not in data:
        return data
    data = dict(data)
    mode = data.pop("mode")
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
    rollout = data.get("rollout")
    rollout = dict(rollout) if isinstance(rollout, Mapping) else {}
    bound = rollout.get("max_staleness")
    if mode == "async" and bound == 0:
        raise ConfigError("mode: async needs rollout.max_staleness >= 1 (0 is mode: sync)")
    if mode == "sync":
        rollout["max_staleness"] = 0
        data["rollout"] = rollout
    return data


def load_recipe(name: str, overrides: Sequence[str] = ()) -> TrainConfig:
    """:func:`load_config` of a shipped recipe (``load_recipe("demo")``: the embedded demo)."""
    return load_config(recipe_path(name), overrides)


def save_config(config: TrainConfig, path: str | Path) -> None:
    """Write ``config`` as YAML that :func:`load_config` reads back identically."""
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))


def write_record(record: Mapping[str, Any], path: str | Path) -> None:
    """Write a config's plain record (``TrainConfig.to_dict()``, as a plan keeps it) as YAML.

    It is checked first: a record that is no valid config raises :class:`ConfigError`.
    """
    save_config(_build(TrainConfig, _spell_mode(copy.deepcopy(dict(record))), ""), path)


__all__ = ["load_config", "load_recipe", "parse_override", "recipe_path", "save_config",
           "write_record"]
