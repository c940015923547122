"""Tasks for harness episodes: a JSONL file, or an environment's seeds.

The rollout source hands out task *seeds* (0, 1, 2, ...; evaluation its own
range). A :class:`TaskSource` turns a seed into the task a harness gets:

- ``path``: a JSONL file, one JSON object a task; seed ``s`` is line
  ``s mod n`` and the task's id is its ``"id"`` (else the line number);
- ``env``: an environment id; the task is ``{"env_id", "seed", "env_kwargs"}``
  and the harness plays that env itself (an
  :class:`~sao_gym.adapters.session.EnvSession` reset with ``seed``, its tools
  given to the agent), so held-out seeds are held-out tasks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sao_gym.utils.jsonl import read_jsonl


@dataclass(frozen=True)
class TaskSource:
    """Seed -> task (module docs). Exactly one of ``path`` and ``env``."""

    path: str | None = None
    env: str | None = None
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.path is None) == (self.env is None):
            raise ValueError("tasks come from a JSONL file (agent.tasks) or an env's seeds "
                             "(env), exactly one")

    def load(self) -> list[dict[str, Any]]:
        """The JSONL file's tasks (``[]`` for an env's seeds); errors name the line."""
        if self.path is None:
            return []
        tasks = [task for _, task in read_jsonl(self.path)]
        if not tasks:
            raise ValueError(f"{self.path} holds no tasks")
        return tasks

    def task(self, seed: int, tasks: list[dict[str, Any]] | None = None
             ) -> tuple[str, dict[str, Any]]:
        """``(task_id, task)`` of ``seed`` (``tasks``: :meth:`load`'s, to read the file once)."""
        if self.env is not None:
            return str(seed), {"env_id": self.env, "seed": seed,
                               "env_kwargs": dict(self.env_kwargs)}
        tasks = self.load() if tasks is None else tasks
        line = seed % len(tasks)
        task = tasks[line]
        return str(task.get("id", line)), dict(task)


async def oracle_task(task: Mapping[str, Any]) -> Mapping[str, Any]:
    """What an oracle is given for ``task``.

    The env's own task of that seed (``env.unwrapped.task``, its reference
    answer included) for an env-seeds task, else the task itself.
    """
    if "env_id" not in task or "seed" not in task:
        return task
    import sao_gym

    env = sao_gym.make(task["env_id"], **dict(task.get("env_kwargs") or {}))
    try:
        await env.areset(seed=int(task["seed"]))
        found = getattr(env.unwrapped, "task", None)
        if not isinstance(found, Mapping):
            raise RuntimeError(f"{task['env_id']} exposes no task for its oracle "
                               "(env.unwrapped.task)")
        return dict(found)
    finally:
        await env.aclose()


async def start_env(task: Mapping[str, Any]) -> tuple[Any, list[Any]]:
    """The env of an env-seeds task, reset on its seed: ``(session, first messages)``.

    ``session`` is an :class:`~sao_gym.adapters.session.EnvSession` (its
    ``tools``, ``asend(message)``, ``done``, ``reward``, ``infra_failure``);
    close it with ``await session.aclose()``.
    """
    from sao_gym.adapters.session import EnvSession

    if not isinstance(task.get("env_id"), str) or "seed" not in task:
        raise ValueError("start_env takes the task of an env's seeds ({env_id, seed, ...}); "
                         f"got keys {sorted(task)}")
    session = EnvSession(task["env_id"], **dict(task.get("env_kwargs") or {}))
    try:
        messages, _ = await session.areset(seed=int(task["seed"]))
    except BaseException:
        await session.aclose()
        raise
    return session, list(messages)


__all__ = ["TaskSource", "oracle_task", "start_env"]
