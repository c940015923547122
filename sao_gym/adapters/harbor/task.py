"""Harbor task directories: reading one (stdlib ``tomllib``) and writing ``task.toml``.

A Harbor task directory (``task.toml`` schema 1.4) holds ``instruction.md``
(the task for the agent), ``task.toml`` (``[verifier]``, ``[agent]``,
``[environment]`` sections), ``environment/Dockerfile`` (the agent's
container), ``tests/test.sh`` (the grader: it writes a number to
``/logs/verifier/reward.txt`` or a JSON object to ``reward.json``) and
``solution/solve.sh`` (the reference solution).

:class:`HarborTask` is what :class:`~sao_gym.adapters.harbor.HarborTaskEnv`
needs of a task: it reads only the fields it uses and rejects what it cannot
run (multi-step tasks, Windows containers) with a clear error. It does not
need the ``harbor`` package. :func:`dump_toml` writes the small TOML subset
that ``task.toml`` needs (strings, numbers, booleans, arrays, tables).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONTAINER_LOGS = "/logs"
"""Where Harbor mounts the trial's logs (``verifier/``, ``agent/``, ``artifacts/``)."""
REWARD_TXT = "/logs/verifier/reward.txt"
REWARD_JSON = "/logs/verifier/reward.json"
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)
_ENV_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class HarborTaskError(ValueError):
    """A directory is not a Harbor task this package can run (the message says why)."""


@dataclass(frozen=True)
class Artifact:
    """One ``artifacts`` entry: a container path copied from the agent's container."""

    source: str
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class HarborTask:
    """The parts of a Harbor task directory that :class:`HarborTaskEnv` uses."""

    path: Path
    name: str
    """``[task].name`` when given, else the directory's name."""
    instruction: str
    """``instruction.md`` with leading canary lines removed."""
    config: Mapping[str, Any]
    """``task.toml`` as parsed by ``tomllib``."""
    verifier_timeout_s: float = 600.0
    agent_timeout_s: float | None = None
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    separate_verifier: bool = False
    """``[verifier].environment_mode`` is ``separate`` (or a verifier environment is set)."""
    artifacts: tuple[Artifact, ...] = ()
    docker_image: str | None = None
    """``[environment].docker_image``: a prebuilt image instead of environment/Dockerfile."""
    workdir: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    network_mode: str = "public"

    @property
    def environment_dir(self) -> Path:
        """``environment/``: the agent container's build context."""
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        """``tests/``: copied to ``/tests`` before ``test.sh`` runs."""
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        """``solution/``: ``solve.sh``, the reference solution."""
        return self.path / "solution"

    @property
    def verifier_context(self) -> Path | None:
        """``tests/`` when it holds the separate verifier's own Dockerfile (tests baked in)."""
        if self.separate_verifier and (self.tests_dir / "Dockerfile").is_file():
            return self.tests_dir
        return None

    def resolved_verifier_env(self) -> dict[str, str]:
        """``[verifier].env`` with ``${VAR}`` / ``${VAR:-default}`` taken from this process."""
        def sub(m: re.Match[str]) -> str:
            value = os.environ.get(m.group(1))
            if value is None and m.group(2) is None:
                raise HarborTaskError(f"task {self.name}: [verifier].env needs ${{{m.group(1)}}}, "
                                      "which is not set")
            return value if value is not None else m.group(2)
        return {k: _ENV_TEMPLATE.sub(sub, v) for k, v in self.verifier_env.items()}


def strip_canary(text: str) -> str:
    """``text`` without leading canary comment lines (and the blank lines after them)."""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY.match(lines[i].strip()):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:])


def _table(config: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = config.get(key, {})
    if not isinstance(value, Mapping):
        raise HarborTaskError(f"{where}: [{key}] must be a table")
    return value


def _number(table: Mapping[str, Any], key: str, where: str) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or value <= 0:
        raise HarborTaskError(f"{where}: {key} must be a positive number, got {value!r}")
    return float(value)


def _tomllib() -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise HarborTaskError("reading task.toml needs Python >= 3.11 (tomllib) or the "
                                  "tomli package") from None
    return tomllib


def load_task(path: str | os.PathLike[str]) -> HarborTask:
    """Read a Harbor task directory; :class:`HarborTaskError` says what is wrong."""
    tomllib = _tomllib()
    root = Path(path).resolve()
    where = str(root)
    if not root.is_dir():
        raise HarborTaskError(f"{where} is not a directory")
    try:
        config = tomllib.loads((root / "task.toml").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HarborTaskError(f"{where} has no task.toml: not a Harbor task directory") from None
    except tomllib.TOMLDecodeError as e:
        raise HarborTaskError(f"{where}/task.toml is not valid TOML: {e}") from None
    if config.get("steps"):
        raise HarborTaskError(f"{where}: multi-step tasks ([[steps]]) are not supported")
    env = _table(config, "environment", where)
    verifier = _table(config, "verifier", where)
    agent = _table(config, "agent", where)
    if str(env.get("os", "linux")).lower() != "linux":
        raise HarborTaskError(f"{where}: only Linux containers are supported, not {env['os']!r}")
    if (root / "environment" / "docker-compose.yaml").is_file():
        raise HarborTaskError(f"{where}: Docker Compose environments are not supported")
    if not env.get("docker_image") and not (root / "environment" / "Dockerfile").is_file():
        raise HarborTaskError(f"{where} has neither environment/Dockerfile nor "
                              "[environment].docker_image")
    try:
        instruction = strip_canary((root / "instruction.md").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HarborTaskError(f"{where} has no instruction.md") from None
    if not instruction.strip():
        raise HarborTaskError(f"{where}/instruction.md is empty")
    if not (root / "tests" / "test.sh").is_file():
        raise HarborTaskError(f"{where} has no tests/test.sh (the grader)")
    mode = verifier.get("environment_mode")
    if mode not in (None, "shared", "separate"):
        raise HarborTaskError(f"{where}: [verifier].environment_mode must be 'shared' or "
                              f"'separate', got {mode!r}")
    separate = mode == "separate" or (mode is None and "environment" in verifier)
    if isinstance(verifier.get("environment"), Mapping) and verifier["environment"].get(
            "docker_image"):
        raise HarborTaskError(f"{where}: a prebuilt verifier image "
                              "([verifier.environment].docker_image) is not supported")
    task = config.get("task") if isinstance(config.get("task"), Mapping) else {}
    memory, storage = _number(env, "memory_mb", where), _number(env, "storage_mb", where)
    return HarborTask(
        path=root,
        name=str(task.get("name") or root.name),
        instruction=instruction,
        config=config,
        verifier_timeout_s=_number(verifier, "timeout_sec", where) or 600.0,
        agent_timeout_s=_number(agent, "timeout_sec", where),
        verifier_env={str(k): str(v) for k, v in dict(verifier.get("env") or {}).items()},
        separate_verifier=separate,
        artifacts=tuple(_artifacts(config.get("artifacts", []), where)),
        docker_image=env.get("docker_image") or None,
        workdir=env.get("workdir") or None,
        cpus=_number(env, "cpus", where),
        memory_mb=int(memory) if memory else None,
        storage_mb=int(storage) if storage else None,
        network_mode=str(env.get("network_mode") or
                         ("no-network" if env.get("allow_internet") is False else "public")),
    )


def _artifacts(entries: Any, where: str) -> list[Artifact]:
    if not isinstance(entries, list):
        raise HarborTaskError(f"{where}: artifacts must be an array")
    out = []
    for entry in entries:
        if isinstance(entry, str):
            out.append(Artifact(entry))
        elif isinstance(entry, Mapping) and isinstance(entry.get("source"), str):
            if entry.get("service") not in (None, "main"):
                raise HarborTaskError(f"{where}: artifacts of compose services are not supported")
            out.append(Artifact(entry["source"], tuple(entry.get("exclude") or ())))
        else:
            raise HarborTaskError(f"{where}: bad artifacts entry {entry!r}")
        if not out[-1].source.startswith("/") or ".." in out[-1].source.split("/"):
            raise HarborTaskError(f"{where}: artifact sources must be absolute paths without "
                                  f"'..', got {out[-1].source!r}")
    return out


def find_tasks(root: str | os.PathLike[str]) -> list[Path]:
    """The task directories (with a ``task.toml``) directly under ``root``, sorted by name."""
    base = Path(root)
    if not base.is_dir():
        raise HarborTaskError(f"{base} is not a directory")
    found = sorted(p for p in base.iterdir() if (p / "task.toml").is_file())
    if not found:
        raise HarborTaskError(f"no Harbor task directories (with a task.toml) in {base}")
    return found


# ----- writing TOML ---------------------------------------------------------------------
def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"TOML has no {value}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic strings
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} values to TOML")


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def dump_toml(data: Mapping[str, Any]) -> str:
    """TOML text of ``data``: scalars and arrays first, then ``[tables]`` (nested ones dotted).

    Example:
        >>> print(dump_toml({"a": 1, "t": {"s": "x", "u": {"b": True}}}), end="")
        a = 1
        <BLANKLINE>
        [t]
        s = "x"
        <BLANKLINE>
        [t.u]
        b = true

    """
    lines: list[str] = []

    def emit(table: Mapping[str, Any], prefix: tuple[str, ...]) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, Mapping)}
        if prefix and (scalars or not table):
            lines.extend(["", f"[{'.'.join(_key(p) for p in prefix)}]"])
        lines.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars.items() if v is not None)
        for k, v in table.items():
            if isinstance(v, Mapping):
                emit(v, (*prefix, k))

    emit(data, ())
    return "\n".join(lines).lstrip("\n") + "\n"
