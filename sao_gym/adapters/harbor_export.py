"""Writing Harbor task directories for sao-gym tasks (:func:`export_tasks`).

One directory (``task.toml`` schema 1.4) per task of ``sao_gym/CodeRepo-v0``
or ``sao_gym/CoqProof-v0``: ``instruction.md``, ``task.toml``,
``environment/Dockerfile`` (on sao-gym's sandbox image, with the repository or
the theorem file copied in), ``tests/test.sh`` (sao-gym's own grading code,
copied verbatim under ``tests/vendor/``, run by ``tests/grade.py`` or
``tests/check_proof.py``) and ``solution/solve.sh`` (the reference solution).
The verifier is ``separate`` (Harbor's linter asks for it): ``/app`` is the
task's artifact, copied from the agent's container into a fresh verifier
container.
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao_gym.adapters import _harbor_grade_code, _harbor_grade_coq
from sao_gym.adapters.harbor_task import HarborTaskError, dump_toml

SUPPORTED_ENVS = ("sao_gym/CodeRepo-v0", "sao_gym/CoqProof-v0")
"""The environments whose tasks :func:`export_tasks` writes."""
CODE_IMAGE = "sao-gym-sandbox:latest"
COQ_IMAGE = "sao-gym-sandbox-coq:latest"
_PKG = Path(__file__).resolve().parents[1]
_SANDBOX_STUB = '''"""Stand-in for sao_gym.sandbox in a Harbor verifier (the interface only)."""

from sao_gym.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxUnavailable

__all__ = ["ExecResult", "Sandbox", "SandboxError", "SandboxUnavailable", "make_sandbox"]


def make_sandbox(*args, **kwargs):
    """There are no sandboxes inside a verifier."""
    raise SandboxUnavailable("no sandboxes inside a Harbor verifier")
'''
_HEADER = '"""sao-gym code copied for a Harbor verifier (standard library only)."""\n'


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def _vendor(tests: Path, modules: dict[str, Path]) -> None:
    """Copy sao-gym modules (``dotted.name: source file``) under ``tests/vendor/``."""
    root = tests / "vendor" / "sao_gym"
    _write(root / "__init__.py", _HEADER)
    _write(root / "sandbox" / "__init__.py", _SANDBOX_STUB)
    _write(root / "sandbox" / "base.py", (_PKG / "sandbox" / "base.py").read_text())
    for dotted, source in modules.items():
        target = root.joinpath(*dotted.split("."))
        for parent in target.relative_to(root).parents:
            init = root / parent / "__init__.py"
            if not init.exists():
                _write(init, _HEADER)
        _write(target.with_suffix(".py"), source.read_text(encoding="utf-8"))


def _heredoc(text: str, word: str) -> tuple[str, str]:
    """A heredoc delimiter that no line of ``text`` equals, and ``text`` ending in a newline."""
    lines = set(text.splitlines())
    n = 0
    while (delim := f"{word}_{n}" if n else word) in lines:
        n += 1
    return delim, text if text.endswith("\n") else text + "\n"


def _config(env_id: str, task_id: str, name: str, description: str, keywords: list[str],
            metadata: dict[str, Any], *, agent_s: float, verifier_s: float,
            memory_mb: int) -> str:
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


# ----- CodeRepo ------------------------------------------------------------------------
def _code_instruction(task: Any) -> str:
    from sao_gym.envs.code_repo import humaneval

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


def _export_code_repo(env: Any, task: Any, out: Path, name: str) -> None:
    from sao_gym.envs.code_repo.env import GIT_ENV, test_dirs_to_clear

    if task.swe is not None:
        raise HarborTaskError(f"task {task.id}: SWE-bench style tasks live in their own "
                              "Docker image; export them with SWE-bench's Harbor adapter")
    _write(out / "instruction.md", _code_instruction(task))
    counts = {"fail_to_pass": len(task.fail_to_pass), "pass_to_pass": len(task.pass_to_pass)}
    _write(out / "task.toml", _config(
        "sao_gym/CodeRepo-v0", task.id, name, f"Repair a Python repository ({task.source} "
        f"task {task.id}), graded by hidden tests", ["sao-gym", "code-repo", task.source,
                                                     "python"],
        {"source": task.source, "category": "software-engineering", **counts},
        agent_s=1800, verifier_s=max(300.0, env.test_timeout_s + 120), memory_mb=2048))
    for path, text in task.files.items():
        _write(out / "environment" / "repo" / path, text)
    _write(out / "environment" / "Dockerfile", (
        f"# sao-gym CodeRepo task {task.id}: the repository at /app, committed to git.\n"
        f"# {CODE_IMAGE} is sao-gym's sandbox image (Debian, python3, pytest, git), built\n"
        "# offline by `sao-gym sandbox build-image`; this build needs no network.\n"
        f"FROM {CODE_IMAGE}\nUSER root\nWORKDIR /app\nCOPY repo/ /app/\n"
        "RUN git config --system --add safe.directory '*' \\\n"
        " && git -c init.defaultBranch=main init -q \\\n && git add -A \\\n"
        " && git -c user.name=sao-gym -c user.email=sao-gym@sandbox commit -q --no-gpg-sign "
        "-m 'initial commit'\n"))
    tests = out / "tests"
    for path, text in task.hidden_tests.items():
        _write(tests / "hidden" / path, text)
    spec = {"task_id": task.id, "fail_to_pass": list(task.fail_to_pass),
            "pass_to_pass": list(task.pass_to_pass), "clear_dirs": test_dirs_to_clear(task),
            "hidden_tests": sorted(task.hidden_tests), "targets": list(task.grading_targets),
            "conftests": sorted(p for p in task.hidden_tests if p.rsplit("/", 1)[-1] ==
                                "conftest.py"),
            "timeout_s": env.test_timeout_s, "timeout_per_test_s": env.test_timeout_per_test_s,
            "partial_credit": env.partial_credit, "env": GIT_ENV}
    _write(tests / "grading.json", json.dumps(spec, indent=1, ensure_ascii=False) + "\n")
    _write(tests / "grade.py", Path(_harbor_grade_code.__file__).read_text(encoding="utf-8"))
    from sao_gym.envs.code_repo import grading

    code_repo = Path(grading.__file__).parent
    _vendor(tests, {"envs.code_repo.grading": code_repo / "grading.py",
                    "envs.code_repo.testrunner": code_repo / "testrunner.py"})
    _write(tests / "test.sh", (
        "#!/bin/bash\n"
        f"# Grader of sao-gym CodeRepo task {task.id}: restore the hidden tests in /app, run\n"
        "# them with sao-gym's test runner (tests/vendor/) and write 1 (every FAIL_TO_PASS and\n"
        "# PASS_TO_PASS test passes) or 0 to /logs/verifier/reward.txt.\n"
        "mkdir -p /logs/verifier\n"
        "if ! python3 -I /tests/grade.py /tests/grading.json /app; then\n"
        "  echo 'the grader failed: reward 0'\n  echo 0 > /logs/verifier/reward.txt\nfi\n"),
        0o755)
    delim, patch = _heredoc(task.reference_patch, "SAO_GYM_PATCH")
    _write(out / "solution" / "solve.sh", (
        f"#!/bin/bash\n# Reference solution of sao-gym CodeRepo task {task.id}: apply the "
        f"reference patch.\nset -euo pipefail\ncd /app\n"
        f"git apply --whitespace=nowarn - <<'{delim}'\n{patch}{delim}\n"), 0o755)


# ----- CoqProof ------------------------------------------------------------------------
def _coq_instruction(task: Any, context: str) -> str:
    parts = [f"# Prove a Coq theorem ({task.id})",
             "Prove the following theorem in the Coq proof assistant (Coq 8.16)."]
    if context.strip():
        parts.append(f"Context (loaded before the theorem):\n\n```coq\n{context.strip()}\n```")
    parts.append(f"Theorem:\n\n```coq\n{task.statement}\n```")
    parts.append(
        "`/app/Task.v` holds the context and the theorem with its proof `Admitted`. Write your "
        "proof script, the tactics that go between `Proof.` and `Qed.` (for example "
        "`intros n. induction n as [|n IH]; simpl; auto.`), to `/app/proof.v`. Only tactics "
        "are allowed (with bullets, braces, goal selectors and queries such as Show, Check or "
        "Search): no Admitted, admit, Axiom, Qed or other commands. To try a script, put it "
        "in place of `Admitted.` in a copy of Task.v (ending it with `Qed.`) and run "
        "`coqc` on the copy. The grader runs Coq on the context, the theorem and your script: "
        "reward 1 if Coq accepts the proof and the theorem depends on no axioms, else 0.")
    return "\n\n".join(parts) + "\n"


def _export_coq(env: Any, task: Any, out: Path, name: str) -> None:
    from sao_gym.envs.coq_proof import checker

    coq = Path(checker.__file__).parent
    _write(out / "instruction.md", _coq_instruction(task, task.context))
    _write(out / "task.toml", _config(
        "sao_gym/CoqProof-v0", task.id, name, f"Prove the Coq theorem {task.name}",
        ["sao-gym", "coq", "theorem-proving", *([task.topic] if task.topic else [])],
        {"category": "theorem-proving", "topic": task.topic,
         **({"difficulty": task.difficulty} if task.difficulty else {})},
        agent_s=900, verifier_s=120 + 2 * env.timeout_s, memory_mb=2048))
    head = task.context.rstrip("\n") + "\n\n" if task.context.strip() else ""
    _write(out / "environment" / "app" / "Task.v", (
        f"{head}{task.statement}\nProof.\n  (* Write the proof script in /app/proof.v. *)\n"
        f"Admitted.\n{task.epilogue}"))
    _write(out / "environment" / "Dockerfile", (
        f"# sao-gym CoqProof task {task.id}: the theorem in /app/Task.v; the proof goes to\n"
        f"# /app/proof.v. {COQ_IMAGE} is sao-gym's sandbox image with Coq 8.16, built\n"
        "# offline by `sao-gym sandbox build-image --tag sao-gym-sandbox-coq:latest\n"
        "# --extra-packages coq,ocaml-base,ocaml,libcoq-core-ocaml,libzarith-ocaml,"
        "libfindlib-ocaml`.\n"
        f"FROM {COQ_IMAGE}\nUSER root\nWORKDIR /app\nCOPY app/ /app/\n"))
    tests = out / "tests"
    record = {k: v for k, v in task.to_dict().items() if k not in ("reference_proof", "name")}
    _write(tests / "task.json", json.dumps({"task": record, "timeout_s": env.timeout_s},
                                           indent=1, ensure_ascii=False) + "\n")
    _write(tests / "check_proof.py", Path(_harbor_grade_coq.__file__).read_text(encoding="utf-8"))
    _vendor(tests, {f"envs.coq_proof.{m}": coq / f"{m}.py"
                    for m in ("checker", "coqlex", "tasks")})
    _write(tests / "test.sh", (
        "#!/bin/bash\n"
        f"# Grader of sao-gym CoqProof task {task.id}: check /app/proof.v with sao-gym's Coq\n"
        "# checker (tests/vendor/) and write 1 (Coq accepts it, no axioms) or 0 to\n"
        "# /logs/verifier/reward.txt.\nmkdir -p /logs/verifier\n"
        "if ! python3 -I /tests/check_proof.py /tests/task.json /app/proof.v; then\n"
        "  echo 'the grader failed: reward 0'\n  echo 0 > /logs/verifier/reward.txt\nfi\n"),
        0o755)
    if task.reference_proof:
        delim, proof = _heredoc(task.reference_proof, "SAO_GYM_PROOF")
        _write(out / "solution" / "solve.sh", (
            f"#!/bin/bash\n# Reference solution of sao-gym CoqProof task {task.id}.\n"
            f"set -euo pipefail\ncat > /app/proof.v <<'{delim}'\n{proof}{delim}\n"), 0o755)


# ----- selecting and writing ---------------------------------------------------------
_WRITERS = {"sao_gym/CodeRepo-v0": ("coderepo", _export_code_repo),
            "sao_gym/CoqProof-v0": ("coqproof", _export_coq)}


def _env_id(env_id: str) -> str:
    full = env_id if "/" in env_id else f"sao_gym/{env_id}"
    if full not in _WRITERS:
        raise ValueError(f"Harbor export supports {' and '.join(SUPPORTED_ENVS)}, not "
                         f"{env_id!r}")
    return full


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
        env_id: ``sao_gym/CodeRepo-v0`` or ``sao_gym/CoqProof-v0`` (the
            ``sao_gym/`` prefix may be left out).
        tasks: task ids (``str``) or reset seeds (``int``: the task that
            ``reset(seed=s)`` picks); ``None`` with ``count``: the first
            ``count`` tasks in the env's order.
        out_dir: where the task directories go (made if missing), named
            ``coderepo-<id>`` / ``coqproof-<id>``.
        count: see ``tasks``.
        env_kwargs: constructor arguments of the env (e.g. ``{"tasks": "bugs"}``).
        overwrite: replace existing task directories (else they are an error).

    Raises:
        ValueError: an unsupported env id, an unknown task id, a task that
            cannot be exported (SWE-bench tasks), an existing directory.

    """
    import sao_gym

    full = _env_id(env_id)
    prefix, writer = _WRITERS[full]
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
