"""Harbor task directories, both ways: export sao-gym tasks, run any Harbor task.

- :func:`export_tasks` (:mod:`.export`) writes one Harbor task
  directory (``task.toml`` schema 1.4) per task of an env that registers a
  ``harbor`` hook (:func:`exportable_env_ids`; the hook writes the directory).
  Command line: ``sao-gym export harbor ENV_ID (--tasks ID,ID | --seeds S,S |
  --count N) OUT_DIR``.
- :class:`HarborTaskEnv` (:mod:`.env`, registered by ``sao_gym.envs``)
  runs any Harbor task directory in a ``DockerSandbox``: a shell tool and a
  submit tool, graded by the task's ``tests/test.sh``.

Neither needs the ``harbor`` package (which needs Python >= 3.12); task
directories are read with ``tomllib`` (:mod:`.task`). See
docs/interop.md (Harbor) for what changes in each direction.

Example:
    >>> from sao_gym.adapters.harbor import export_tasks
    >>> dirs = export_tasks("my_pkg.envs:my/Env-v0", ["task-0"], "/tmp/harbor-doc",
    ...                     overwrite=True)  # doctest: +SKIP
    >>> env = HarborTaskEnv(task_dir=dirs[0])  # doctest: +SKIP

"""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from sao_gym.adapters.harbor.env import HarborTaskEnv
from sao_gym.adapters.harbor.export import export_tasks, exportable_env_ids, select_tasks
from sao_gym.adapters.harbor.task import HarborTask, HarborTaskError, find_tasks, load_task

__all__ = ["HarborTask", "HarborTaskEnv", "HarborTaskError", "add_export_parser",
           "export_tasks", "exportable_env_ids", "find_tasks", "load_task", "select_tasks"]


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _cmd_export_harbor(args: argparse.Namespace) -> int:
    try:
        if args.seeds is not None:
            tasks: list[str | int] | None = [int(s) for s in _split(args.seeds)]
        else:
            tasks = _split(args.tasks) if args.tasks is not None else None
        kwargs = yaml.safe_load(args.env_kwargs) if args.env_kwargs else {}
        if not isinstance(kwargs, dict):
            raise ValueError(f"--env-kwargs must be a YAML mapping, got {args.env_kwargs!r}")
        written = export_tasks(args.env_id, tasks, args.out_dir, count=args.count,
                               env_kwargs=kwargs, overwrite=args.overwrite)
    except (ValueError, OSError, yaml.YAMLError) as e:
        print(f"FAIL: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(json.dumps({"env_id": args.env_id, "out": args.out_dir,
                      "tasks": [str(p) for p in written]}))
    return 0


def add_export_parser(export_sub: argparse._SubParsersAction) -> None:
    """Add ``harbor`` to the subcommands of ``sao-gym export``."""
    p = export_sub.add_parser(
        "harbor", help="write Harbor task directories (task.toml 1.4) for an env's tasks",
        description="Write one Harbor task directory per task of an env that has a Harbor "
                    "exporter (a 'harbor' hook in its registration); another env id is "
                    "answered with the list of those that have one.")
    p.add_argument("env_id", help="an env with a Harbor exporter")
    p.add_argument("out_dir", metavar="OUT", help="output directory")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--tasks", help="comma-separated task ids")
    which.add_argument("--seeds", help="comma-separated reset seeds (the tasks they pick)")
    which.add_argument("--count", type=int, help="the first N tasks, in the env's order")
    p.add_argument("--env-kwargs", metavar="YAML",
                   help="env constructor options as a YAML mapping, e.g. '{tasks: bugs}'")
    p.add_argument("--overwrite", action="store_true", help="replace existing task directories")
    p.set_defaults(fn=_cmd_export_harbor)
