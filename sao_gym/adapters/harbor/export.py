"""Writing Harbor task directories for sao-gym tasks (:func:`export_tasks`).

An environment exports its tasks through its ``harbor`` hook (registered with
``sao_gym.register(..., hooks={"harbor": "my_pkg.harbor:export_task"})``;
:func:`exportable_env_ids` lists the envs that have one), called as
``export_task(env, task, out, name)`` for each chosen task of the env (``env``
unwrapped, made with the caller's ``env_kwargs``; ``env.tasks`` is its list of
tasks, each with an ``id``). It writes one directory (``task.toml`` schema 1.4,
named ``name``): ``instruction.md``, ``task.toml`` (:func:`task_toml`),
``environment/Dockerfile``, ``tests/test.sh`` (the grader, which may run
sao-gym's own code copied verbatim under ``tests/vendor/`` by :func:`vendor`)
and ``solution/solve.sh`` (the reference solution). The verifier is
``separate`` (Harbor's linter asks for it): ``/app`` is the task's artifact,
copied from the agent's container into a fresh verifier container.
"""

from __future__ import annotations

import difflib
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gymnasium.envs.registration import parse_env_id

from sao_gym.adapters.harbor.task import dump_toml

HOOK = "harbor"
"""The name of an env's Harbor task exporter among its registration's hooks."""
_PKG = Path(__file__).resolve().parents[2]
_SANDBOX_STUB = '''"""Stand-in for sao_gym.sandbox in a Harbor verifier (the interface only)."""

from sao_gym.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxUnavailable

__all__ = ["ExecResult", "Sandbox", "SandboxError", "SandboxUnavailable", "make_sandbox"]


def make_sandbox(*args, **kwargs):
    """There are no sandboxes inside a verifier."""
    raise SandboxUnavailable("no sandboxes inside a Harbor verifier")
'''
_HEADER = '"""sao-gym code copied for a Harbor verifier (standard library only)."""\n'


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` (parents made) with permissions ``mode``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def vendor(tests: Path, modules: dict[str, Path]) -> None:
    """Copy sao-gym modules (``dotted.name: source file``) under ``tests/vendor/``.

    ``dotted.name`` is relative to ``sao_gym`` (``envs.my_env.grading``); the
    sandbox interface (``sao_gym.sandbox.base`` and a stub ``make_sandbox``)
    comes along, so vendored modules may import it.
    """
    root = tests / "vendor" / "sao_gym"
    write_text(root / "__init__.py", _HEADER)
    write_text(root / "sandbox" / "__init__.py", _SANDBOX_STUB)
    write_text(root / "sandbox" / "base.py", (_PKG / "sandbox" / "base.py").read_text())
    for dotted, source in modules.items():
        target = root.joinpath(*dotted.split("."))
        for parent in target.relative_to(root).parents:
            init = root / parent / "__init__.py"
            if not init.exists():
                write_text(init, _HEADER)
        write_text(target.with_suffix(".py"), source.read_text(encoding="utf-8"))


def heredoc(text: str, word: str) -> tuple[str, str]:
    """A heredoc delimiter that no line of ``text`` equals, and ``text`` ending in a newline."""
    lines = set(text.splitlines())
    n = 0
    while (delim := f"{word}_{n}" if n else word) in lines:
        n += 1
    return delim, text if text.endswith("\n") else text + "\n"


def task_toml(env_id: str, task_id: str, name: str, description: str, keywords: list[str],
              metadata: dict[str, Any], *, agent_s: float, verifier_s: float,
              memory_mb: int) -> str:
    """The ``task.toml`` of an exported task: schema 1.4, ``/app`` as the artifact.

    ``metadata`` goes under ``[metadata.sao_gym]`` with the env id, the task id
    and sao-gym's version; the verifier runs in a separate container.
    """
    import sao_gym

    return dump_toml({
        "schema_version": "1.4",
        "artifacts": ["/app"],
        "task": {"name": f"sao-gym/{name}", "description": description, "keywords": keywords},
        "metadata": {"sao_gym": {"env_id": env_id, "task_id": task_id,
                                 "version": sao_gym.__version__, **metadata}},
        "verifier": {"timeout_sec": float(verifier_s), "environment_mode": "separate"},
        "agent": {"timeout_sec": float(agent_s)},
        "environment": {"build_timeout_sec": 600.0, "cpus": 1, "memory_mb": memory_mb,
                        "storage_mb": 2048, "workdir": "/app"},
    })


def exportable_env_ids() -> list[str]:
    """The registered envs with a ``harbor`` hook: those :func:`export_tasks` writes."""
    from sao_gym.registration import env_hook, env_ids

    def has_hook(env_id: str) -> bool:
        try:
            return env_hook(env_id, HOOK) is not None
        except ImportError:  # it has one; export_tasks says why it cannot load
            return True

    return [env_id for env_id in env_ids() if has_hook(env_id)]


def _exporter(env_id: str) -> tuple[str, Callable[..., Any]]:
    """The registered id of ``env_id`` and its ``harbor`` hook.

    Without a namespace, ``Name-vN`` is sao-gym's (``sao_gym/Name-vN``). An env
    without the hook is a ValueError that names those that have one.
    """
    import gymnasium

    from sao_gym.registration import env_hook, resolve_id

    full = env_id if "/" in env_id or ":" in env_id else f"sao_gym/{env_id}"
    try:
        full = resolve_id(full)
        hook = env_hook(full, HOOK)
    except gymnasium.error.UnregisteredEnv:
        hook = None
    if hook is None:
        have = exportable_env_ids()
        names = " and ".join([", ".join(have[:-1]), have[-1]] if len(have) > 1 else have)
        raise ValueError(f"Harbor export supports {names or 'no registered env'}, not "
                         f"{env_id!r} (an env exports its tasks through a {HOOK!r} hook)")
    return full, hook


def select_tasks(env: Any, tasks: Sequence[str | int] | None, count: int | None) -> list[Any]:
    """The env's tasks named by ids (``str``), reset seeds (``int``) or the first ``count``."""
    import gymnasium.utils.seeding

    pool = list(env.tasks)
    if tasks is None:
        if count is None or isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError("give task ids, seeds or a count >= 1")
        return pool[:count]
    by_id = {t.id: t for t in pool}
    chosen: list[Any] = []
    for item in tasks:
        if isinstance(item, int) and not isinstance(item, bool):
            rng, _ = gymnasium.utils.seeding.np_random(item)  # what reset(seed=item) draws
            task = pool[int(rng.integers(0, len(pool)))]
        elif isinstance(item, str) and item in by_id:
            task = by_id[item]
        elif isinstance(item, str):
            close = difflib.get_close_matches(item, list(by_id), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"unknown task id {item!r} ({len(pool)} tasks, e.g. "
                             f"{', '.join(list(by_id)[:3])}){hint}")
        else:
            raise ValueError(f"tasks are ids (str) or seeds (int), got {item!r}")
        if task not in chosen:
            chosen.append(task)
    if not chosen:
        raise ValueError("no tasks selected")
    return chosen


def _dir_name(prefix: str, task_id: str, taken: set[str]) -> str:
    import hashlib

    name = f"{prefix}-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", task_id).strip("-.").lower()
                           or "task")
    if name in taken:
        name += "-" + hashlib.sha1(task_id.encode()).hexdigest()[:6]
    taken.add(name)
    return name


def export_tasks(env_id: str, tasks: Sequence[str | int] | None, out_dir: str | Path, *,
                 count: int | None = None, env_kwargs: dict[str, Any] | None = None,
                 overwrite: bool = False) -> list[Path]:
    """Write one Harbor task directory per task under ``out_dir``; return their paths.

    Args:
        env_id: an env with a ``harbor`` hook (:func:`exportable_env_ids`; for
            sao-gym's own, the ``sao_gym/`` namespace may be left out).
        tasks: task ids (``str``) or reset seeds (``int``: the task that
            ``reset(seed=s)`` picks); ``None`` with ``count``: the first
            ``count`` tasks in the env's order.
        out_dir: where the task directories go (made if missing), named
            ``<env name>-<task id>`` in lower case (``myenv-0`` for task ``0`` of
            ``my/MyEnv-v0``).
        count: see ``tasks``.
        env_kwargs: constructor arguments of the env (e.g. ``{"tasks": "bugs"}``).
        overwrite: replace existing task directories (else they are an error).

    Raises:
        ValueError: an env without a ``harbor`` hook, an unknown task id, a task
            that its env cannot export, an existing directory.

    """
    import sao_gym

    full, writer = _exporter(env_id)
    prefix = parse_env_id(full)[1].lower()
    env = sao_gym.make(full, record_statistics=False, **dict(env_kwargs or {})).unwrapped
    try:
        chosen = select_tasks(env, tasks, count)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        taken: set[str] = set()
        names = [_dir_name(prefix, t.id, taken) for t in chosen]
        for name in names:
            if (out / name).exists() and not overwrite:
                raise ValueError(f"{out / name} exists (pass overwrite=True / --overwrite)")
        written = []
        for task, name in zip(chosen, names, strict=True):
            target = out / name
            if target.exists():
                shutil.rmtree(target)
            try:
                writer(env, task, target, name)
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
            written.append(target)
        return written
    finally:
        env.close()
