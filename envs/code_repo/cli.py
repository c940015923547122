"""``sao-gym tasks make-code-repo``: bug-injection tasks for ``sao_gym/CodeRepo-v0``.

:func:`add_parser` mounts the command under ``sao-gym tasks``; :func:`run`
mutates a package's functions (:mod:`.mutate`), keeps the mutants that its own
tests catch, writes them as a task file (``.jsonl`` or ``.jsonl.gz``) and
prints a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    """Make the tasks; exit status 0 when at least one was kept."""
    from sao_gym.envs.code_repo.mutate import make_bug_tasks_sync
    from sao_gym.envs.code_repo.packages import resolve_package
    from sao_gym.envs.code_repo.tasks import write_jsonl
    from sao_gym.sandbox.base import SandboxError

    try:
        package = resolve_package(args.package)
        records, stats = make_bug_tasks_sync(
            package, max_tasks=args.max_tasks, seed=args.seed, sandbox=args.sandbox,
            max_tries=args.max_tries, progress=lambda msg: print(msg, file=sys.stderr))
    except (ValueError, SandboxError, OSError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    out = Path(args.out or f"{package.name}.jsonl.gz")
    write_jsonl(out, records)
    print(json.dumps({"out": str(out), "package": package.name, "version": package.version,
                      "tasks": stats.kept, "tried": stats.tried, "candidates": stats.candidates,
                      "baseline_tests": stats.baseline_tests, "rejected": stats.rejected}))
    return 0 if stats.kept else 1


def add_parser(tasks_sub: argparse._SubParsersAction) -> None:
    """Add ``make-code-repo`` to the subcommands of ``sao-gym tasks``."""
    p = tasks_sub.add_parser(
        "make-code-repo", help="bug-injection tasks for sao_gym/CodeRepo-v0: mutate a "
        "package's functions, keep mutants that its own tests catch")
    p.add_argument("--package", required=True, help="a shipped package name, a package "
                   "directory, an sdist .tar.gz, or a PyPI name (pip download)")
    p.add_argument("--out", help="output .jsonl or .jsonl.gz (default NAME.jsonl.gz)")
    p.add_argument("--max-tasks", type=int, default=20)
    p.add_argument("--max-tries", type=int, default=None, help="mutants to test at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sandbox", default="local", help="sandbox backend (local or docker)")
    p.set_defaults(fn=run)
