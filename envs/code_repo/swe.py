"""SWE-bench / SWE-Gym style instances as :class:`~.tasks.RepoTask` records.

An instance is one JSON object per line with ``instance_id``, ``repo``,
``base_commit``, ``patch`` (the reference fix), ``test_patch`` (the hidden
tests), ``problem_statement``, ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (lists,
or JSON-encoded lists as in the SWE-bench datasets) and optionally:

- ``image``: the Docker image with the repository and its environment
  (default: ``image_template`` filled with the instance id, SWE-bench's
  ``sweb.eval.x86_64.<id>`` naming);
- ``repo_dir``: where the image holds the repository (default ``/testbed``);
  it is copied into the sandbox's writable workdir at reset;
- ``host_repo``: a checkout on this machine to upload instead (then no image
  is needed: the sandbox's default one is used unless ``image`` is given);
- ``test_cmd``: the shell command running the tests, ``{tests}`` standing for
  the test ids (default: activate SWE-bench's ``testbed`` conda environment
  when present, then ``python -m pytest -rA``);
- ``runner``: ``pytest`` (default) or ``builtin`` (the stdlib runner, for
  images without pytest).

Episodes of these tasks run in whatever sandbox the environment is given;
with ``sandbox="docker"`` the instance's image is used. Grading restores
the files that ``test_patch`` touches to ``base_commit``, applies
``test_patch`` with ``git apply`` and runs ``FAIL_TO_PASS`` and
``PASS_TO_PASS``.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sao_gym.envs.code_repo.tasks import RepoTask, SweSpec, patched_paths, read_jsonl

IMAGE_TEMPLATE = "sweb.eval.x86_64.{instance_id_docker}:latest"
"""SWE-bench's image naming (``__`` in the id becomes ``_1776_``)."""
DEFAULT_TEST_CMD = (
    "if [ -f /opt/miniconda3/bin/activate ]; then . /opt/miniconda3/bin/activate testbed; fi; "
    "python -m pytest -rA -p no:cacheprovider {tests}"
)
REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS",
            "PASS_TO_PASS")

PROMPT = (
    "You are working in a checkout of the repository `{repo}` (the current directory). "
    "Resolve the following issue by editing the repository's source code.\n\n"
    "<issue>\n{statement}\n</issue>\n\n"
    "Hidden tests check the fix; existing tests must keep passing. Do not modify tests: "
    "the test files are restored before grading. Call `submit` when you are done."
)


def _id_list(value: Any, key: str, iid: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{iid}: {key} is not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{iid}: {key} must be a list of test ids")
    return tuple(value)


def task_from_instance(inst: Mapping[str, Any], *, image_template: str = IMAGE_TEMPLATE,
                       repo_dir: str = "/testbed", test_cmd: str | None = None) -> RepoTask:
    """One SWE-bench style instance as a task (see the module docs for the fields)."""
    missing = [k for k in REQUIRED if k not in inst]
    iid = str(inst.get("instance_id", "?"))
    if missing:
        raise ValueError(f"instance {iid}: missing field(s) {', '.join(missing)}")
    f2p = _id_list(inst["FAIL_TO_PASS"], "FAIL_TO_PASS", iid)
    p2p = _id_list(inst["PASS_TO_PASS"], "PASS_TO_PASS", iid)
    if not f2p:
        raise ValueError(f"instance {iid}: FAIL_TO_PASS is empty")
    runner = str(inst.get("runner", "pytest"))
    if runner not in ("pytest", "builtin"):
        raise ValueError(f"instance {iid}: runner must be 'pytest' or 'builtin', got {runner!r}")
    image = inst.get("image") or (None if inst.get("host_repo") else image_template.format(
        instance_id=iid, instance_id_docker=iid.replace("__", "_1776_").lower()))
    test_files = [p for p in patched_paths(str(inst["test_patch"])) if p.endswith(".py")]
    test_dirs = tuple(dict.fromkeys(posixpath.dirname(p) or "." for p in test_files)) \
        or ("tests",)
    spec = SweSpec(repo=str(inst["repo"]), base_commit=str(inst["base_commit"]),
                   test_patch=str(inst["test_patch"]), image=image,
                   repo_dir=inst.get("repo_dir", repo_dir),
                   host_repo=inst.get("host_repo"),
                   test_cmd=inst.get("test_cmd") or test_cmd or
                   (DEFAULT_TEST_CMD if runner == "pytest" else None))
    statement = str(inst.get("problem_statement", "")).strip() or "(no issue text)"
    return RepoTask(
        id=iid,
        prompt=PROMPT.format(repo=spec.repo, statement=statement),
        files={},
        hidden_tests={},
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        reference_patch=str(inst["patch"]),
        source="swe",
        test_dirs=test_dirs,
        runner=runner,
        metadata={k: inst[k] for k in ("version", "created_at", "environment_setup_commit")
                  if k in inst} | {"test_files": test_files},
        swe=spec,
    )


def load_swe_instances(path: str | Path, **kwargs: Any) -> list[RepoTask]:
    """Tasks from a SWE-bench / SWE-Gym JSONL file (``kwargs``: see :func:`task_from_instance`)."""
    return [task_from_instance(inst, **kwargs) for inst in read_jsonl(path)]
