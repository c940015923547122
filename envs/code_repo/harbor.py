"""Harbor export of ``sao_gym/CodeRepo-v0`` tasks: the env's ``harbor`` hook.

:func:`export_task` writes one task directory (the layout common to all envs is
in :mod:`sao_gym.adapters.harbor.export`): the repository committed to git at
``/app`` (``environment/``), the hidden tests and :mod:`.harbor_grade` as
``tests/grade.py`` with sao-gym's own grading code vendored next to it, and the
reference patch as ``solution/solve.sh``. HumanEval and bug-injection tasks
export; SWE-bench style tasks live in their own images (SWE-bench's Harbor
adapter exports them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sao_gym.adapters.harbor.export import heredoc, task_toml, vendor, write_text
from sao_gym.adapters.harbor.task import HarborTaskError
from sao_gym.envs.code_repo import grading, harbor_grade, humaneval, testrunner
from sao_gym.envs.code_repo.env import GIT_ENV, test_dirs_to_clear
from sao_gym.sandbox.image import DEFAULT_IMAGE

IMAGE = DEFAULT_IMAGE
"""The base image of exported tasks: sao-gym's sandbox image (python3, pytest, git)."""


def instruction(task: Any) -> str:
    """The task's ``instruction.md``: what to repair, where, and how it is graded."""
    if task.source == "humaneval":
        entry, stub = task.metadata["entry_point"], task.files[humaneval.MODULE]
        body = (f"The repository contains `solution.py`, a Python module whose function "
                f"`{entry}` is not implemented yet:\n\n```python\n{stub}```\n\nImplement "
                f"`{entry}` in `solution.py` so that it does what its docstring says. Hidden "
                "tests will call it on many inputs.")
        if task.metadata.get("visible_examples"):
            body += (" `tests/test_examples.py` runs the docstring's examples: "
                     "`python3 -m pytest -q tests`.")
    else:
        body = task.prompt + ("\n\nRun the test suite with `python3 -m pytest -q` (with "
                              "`PYTHONPATH=src` when the package lives under `src/`).")
    dirs = ", ".join(f"`{d}/`" for d in task.test_dirs)
    return (f"# Repair a Python repository ({task.id})\n\nYou are working in a git repository "
            f"at `/app` (the current directory; `git diff` shows your changes).\n\n{body}\n\n"
            f"When you are done, leave your changes in `/app`: hidden tests grade the "
            f"repository. The test directories ({dirs}) are restored to their original "
            "state before grading, so edits to the tests do not count. There is no need for "
            "network access.\n")


def export_task(env: Any, task: Any, out: Path, name: str) -> None:
    """Write the Harbor task directory ``out`` (named ``name``) of one task of ``env``."""
    if task.swe is not None:
        raise HarborTaskError(f"task {task.id}: SWE-bench style tasks live in their own "
                              "Docker image; export them with SWE-bench's Harbor adapter")
    write_text(out / "instruction.md", instruction(task))
    counts = {"fail_to_pass": len(task.fail_to_pass), "pass_to_pass": len(task.pass_to_pass)}
    write_text(out / "task.toml", task_toml(
        env.spec.id, task.id, name, f"Repair a Python repository ({task.source} "
        f"task {task.id}), graded by hidden tests", ["sao-gym", "code-repo", task.source,
                                                     "python"],
        {"source": task.source, "category": "software-engineering", **counts},
        agent_s=1800, verifier_s=max(300.0, env.test_timeout_s + 120), memory_mb=2048))
    for path, text in task.files.items():
        write_text(out / "environment" / "repo" / path, text)
    write_text(out / "environment" / "Dockerfile", (
        f"# sao-gym CodeRepo task {task.id}: the repository at /app, committed to git.\n"
        f"# {IMAGE} is sao-gym's sandbox image (Debian, python3, pytest, git), built\n"
        "# offline by `sao-gym sandbox build-image`; this build needs no network.\n"
        f"FROM {IMAGE}\nUSER root\nWORKDIR /app\nCOPY repo/ /app/\n"
        "RUN git config --system --add safe.directory '*' \\\n"
        " && git -c init.defaultBranch=main init -q \\\n && git add -A \\\n"
        " && git -c user.name=sao-gym -c user.email=sao-gym@sandbox commit -q --no-gpg-sign "
        "-m 'initial commit'\n"))
    tests = out / "tests"
    for path, text in task.hidden_tests.items():
        write_text(tests / "hidden" / path, text)
    spec = {"task_id": task.id, "fail_to_pass": list(task.fail_to_pass),
            "pass_to_pass": list(task.pass_to_pass), "clear_dirs": test_dirs_to_clear(task),
            "hidden_tests": sorted(task.hidden_tests), "targets": list(task.grading_targets),
            "conftests": sorted(p for p in task.hidden_tests if p.rsplit("/", 1)[-1] ==
                                "conftest.py"),
            "timeout_s": env.test_timeout_s, "timeout_per_test_s": env.test_timeout_per_test_s,
            "partial_credit": env.partial_credit, "env": GIT_ENV}
    write_text(tests / "grading.json", json.dumps(spec, indent=1, ensure_ascii=False) + "\n")
    write_text(tests / "grade.py", Path(harbor_grade.__file__).read_text(encoding="utf-8"))
    vendor(tests, {"envs.code_repo.grading": Path(grading.__file__),
                   "envs.code_repo.testrunner": Path(testrunner.__file__)})
    write_text(tests / "test.sh", (
        "#!/bin/bash\n"
        f"# Grader of sao-gym CodeRepo task {task.id}: restore the hidden tests in /app, run\n"
        "# them with sao-gym's test runner (tests/vendor/) and write 1 (every FAIL_TO_PASS and\n"
        "# PASS_TO_PASS test passes) or 0 to /logs/verifier/reward.txt.\n"
        "mkdir -p /logs/verifier\n"
        "if ! python3 -I /tests/grade.py /tests/grading.json /app; then\n"
        "  echo 'the grader failed: reward 0'\n  echo 0 > /logs/verifier/reward.txt\nfi\n"),
        0o755)
    delim, patch = heredoc(task.reference_patch, "SAO_GYM_PATCH")
    write_text(out / "solution" / "solve.sh", (
        f"#!/bin/bash\n# Reference solution of sao-gym CodeRepo task {task.id}: apply the "
        f"reference patch.\nset -euo pipefail\ncd /app\n"
        f"git apply --whitespace=nowarn - <<'{delim}'\n{patch}{delim}\n"), 0o755)
