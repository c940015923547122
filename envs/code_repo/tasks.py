"""Task records of ``sao_gym/CodeRepo-v0`` and where they come from.

A :class:`RepoTask` is one repository-repair problem: the repository's files
at the start, a problem statement, hidden test files written fresh before
grading, the ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` test ids (SWE-bench
semantics) and a reference patch (a unified diff against the repository).

Sources (:func:`~sao_gym.envs.code_repo.sources.load_tasks`):

- ``"humaneval"``: the 164 HumanEval problems as one-module repositories
  (:mod:`.humaneval`);
- ``"bugs"``: bugs injected into real pure-Python packages, validated
  against the packages' own test suites (:mod:`.mutate`), shipped in
  ``data/bugs/*.jsonl.gz``;
- ``"all"``: both;
- a path to a ``.jsonl`` (or ``.jsonl.gz``) file: bug tasks written by
  ``sao-gym tasks make-code-repo``, or SWE-bench / SWE-Gym instances
  (:mod:`.swe`), told apart by their keys.

Bug-task files hold one ``{"kind": "package", ...}`` record (the package's
files, its test files and the test ids that pass on the original source)
followed by ``{"kind": "task", ...}`` records (the bug as a patch and its
``FAIL_TO_PASS`` ids); ``PASS_TO_PASS`` is the package's passing tests minus
``FAIL_TO_PASS``. Each package's source is stored once.
"""

from __future__ import annotations

import difflib
import gzip
import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DATA_DIR = Path(__file__).with_name("data")
BUGS_DIR = DATA_DIR / "bugs"


@dataclass(frozen=True)
class SweSpec:
    """Where a SWE-bench style task's repository lives and how its tests run."""

    repo: str
    """``owner/name`` of the upstream repository."""
    base_commit: str
    """The commit the task starts from."""
    test_patch: str
    """The diff that adds the hidden tests (applied at grading)."""
    image: str | None = None
    """The Docker image holding the repository (at ``repo_dir``) and its environment."""
    repo_dir: str | None = "/testbed"
    """Path of the repository inside the image (copied into the workdir at reset)."""
    host_repo: str | None = None
    """A host checkout to upload instead of copying ``repo_dir`` from the image."""
    test_cmd: str | None = None
    """Shell command running the tests; ``{tests}`` is replaced by the test ids."""


@dataclass(frozen=True)
class RepoTask:
    """One repository-repair task (see the module docs)."""

    id: str
    prompt: str
    """The problem statement shown to the agent."""
    files: Mapping[str, str]
    """The repository at the start, path -> text (empty when it comes from an image)."""
    hidden_tests: Mapping[str, str]
    """Test files written fresh before grading, path -> text."""
    fail_to_pass: tuple[str, ...]
    """Test ids that must pass after the fix (they fail before it)."""
    pass_to_pass: tuple[str, ...]
    """Test ids that pass before the fix and must still pass."""
    reference_patch: str
    """A unified diff (``a/`` and ``b/`` prefixes) that solves the task."""
    source: str
    """``humaneval``, ``bugs``, ``swe`` or ``custom``."""
    test_dirs: tuple[str, ...] = ("tests",)
    """Where ``run_tests`` looks for ``test_*.py`` files (the agent's current copies)."""
    runner: str = "builtin"
    """``builtin`` (the stdlib runner, :mod:`.testrunner`) or ``pytest``."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    swe: SweSpec | None = None

    @property
    def grading_targets(self) -> tuple[str, ...]:
        """The test files the grader runs: every hidden test file named by an id."""
        named = {tid.split("::", 1)[0] for tid in (*self.fail_to_pass, *self.pass_to_pass)}
        return tuple(sorted(named))

    def public(self) -> dict[str, Any]:
        """The task as a plain dict (``env.unwrapped.task``); never shown to the model."""
        out = {
            "id": self.id,
            "prompt": self.prompt,
            "source": self.source,
            "reference_patch": self.reference_patch,
            "FAIL_TO_PASS": list(self.fail_to_pass),
            "PASS_TO_PASS": list(self.pass_to_pass),
            "metadata": dict(self.metadata),
        }
        if self.swe is not None:
            out.update(repo=self.swe.repo, base_commit=self.swe.base_commit,
                       image=self.swe.image)
        return out


# ----- diffs --------------------------------------------------------------------------
def unified_diff(path: str, old: str, new: str, context: int = 3) -> str:
    r"""A git-style unified diff of one text file (``""`` when unchanged).

    Example:
        >>> print(unified_diff("a.py", "x = 1\n", "x = 2\n"), end="")
        diff --git a/a.py b/a.py
        --- a/a.py
        +++ b/a.py
        @@ -1 +1 @@
        -x = 1
        +x = 2

    """
    if old == new:
        return ""
    lines = list(difflib.unified_diff(
        _lines(old), _lines(new), f"a/{path}", f"b/{path}", n=context, lineterm="\n"))
    body = []
    for line in lines:
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        body.append(line)
    # difflib writes "--- a/x\t" headers without tabs when no dates are given.
    return f"diff --git a/{path} b/{path}\n" + "".join(body)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def diff_files(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    """The unified diff from one file map to another (modified files only)."""
    return "".join(unified_diff(p, old[p], new[p]) for p in sorted(old) if p in new)


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def patched_paths(patch: str) -> list[str]:
    """Paths a unified diff touches (its ``+++ b/...`` headers, or ``---`` for deletions)."""
    paths = []
    for line in patch.splitlines():
        if line.startswith("+++ ") or line.startswith("--- "):
            name = line[4:].split("\t")[0].strip()
            if name != "/dev/null":
                name = name[2:] if name[:2] in ("a/", "b/") else name
                if name not in paths:
                    paths.append(name)
    return paths


def apply_patch(files: Mapping[str, str], patch: str) -> dict[str, str]:
    """Apply a unified diff of modified text files; context must match exactly.

    Raises ``ValueError`` when a hunk does not apply. (In the sandbox, ``git
    apply`` is used instead; this is for building repositories on the host.)
    """
    out = dict(files)
    for path, hunks in _parse_patch(patch):
        if path not in out:
            raise ValueError(f"patch modifies {path!r}, which does not exist")
        lines = _lines(out[path])
        shift = 0
        for start, old_lines, new_lines in hunks:
            at = max(start - 1, 0) + shift
            if lines[at:at + len(old_lines)] != old_lines:
                raise ValueError(f"hunk at line {start} of {path} does not apply")
            lines[at:at + len(old_lines)] = new_lines
            shift += len(new_lines) - len(old_lines)
        out[path] = "".join(lines)
    return out


def _parse_patch(patch: str) -> Iterator[tuple[str, list[tuple[int, list[str], list[str]]]]]:
    path: str | None = None
    hunks: list[tuple[int, list[str], list[str]]] = []
    raw = patch.splitlines(keepends=True)
    i = 0
    while i < len(raw):
        line = raw[i]
        if line.startswith("+++ "):
            if path is not None:
                yield path, hunks
            name = line[4:].split("\t")[0].strip()
            path, hunks = (name[2:] if name.startswith("b/") else name), []
        elif (m := _HUNK.match(line)) and path is not None:
            old_n = int(m.group(2)) if m.group(2) is not None else 1
            new_n = int(m.group(4)) if m.group(4) is not None else 1
            old_lines: list[str] = []
            new_lines: list[str] = []
            i += 1
            while i < len(raw) and (len(old_lines) < old_n or len(new_lines) < new_n):
                body = raw[i]
                tag, text = (" ", body) if body in ("\n", "\r\n") else (body[:1], body[1:])
                if i + 1 < len(raw) and raw[i + 1].startswith("\\"):
                    text = text[:-1] if text.endswith("\n") else text
                    i += 1
                if tag == " ":
                    old_lines.append(text)
                    new_lines.append(text)
                elif tag == "-":
                    old_lines.append(text)
                elif tag == "+":
                    new_lines.append(text)
                i += 1
            hunks.append((int(m.group(1)) if old_n else int(m.group(1)) + 1, old_lines,
                          new_lines))
            continue
        i += 1
    if path is not None:
        yield path, hunks


# ----- JSONL ----------------------------------------------------------------------------
def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``.jsonl`` or ``.jsonl.gz`` file (blank lines skipped)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        out = []
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not JSON ({e})") from None
        return out


def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Write records as JSON lines (gzip-compressed when the name ends in ``.gz``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)
    if path.suffix == ".gz":
        with gzip.GzipFile(path, "wb", mtime=0) as f:  # mtime 0: reproducible bytes
            f.write(text.encode("utf-8"))
    else:
        path.write_text(text, encoding="utf-8")


# ----- bug tasks ------------------------------------------------------------------------
BUG_PROMPT = (
    "The test suite of the Python package `{package}` (version {version}) has started to "
    "fail: {n_fail} test(s) fail, for example:\n{examples}\n\n"
    "Find the bug in the package's source code and fix it, so that the whole test suite "
    "passes again. Do not modify the tests: they are restored before grading."
)


def bug_tasks_from_records(records: list[dict[str, Any]], origin: str = "") -> list[RepoTask]:
    """Build tasks from a bug-task file's records (a package record, then its tasks)."""
    packages: dict[str, dict[str, Any]] = {}
    tasks = []
    for n, rec in enumerate(records, 1):
        kind = rec.get("kind")
        if kind == "package":
            for key in ("name", "files", "test_files", "baseline_pass"):
                if key not in rec:
                    raise ValueError(f"{origin} record {n}: package record lacks {key!r}")
            packages[rec["name"]] = rec
        elif kind == "task":
            pkg = packages.get(rec.get("package", ""))
            if pkg is None:
                raise ValueError(f"{origin} record {n}: task of unknown package "
                                 f"{rec.get('package')!r} (its package record must come first)")
            tasks.append(_bug_task(pkg, rec))
        else:
            raise ValueError(f"{origin} record {n}: unknown kind {kind!r}")
    return tasks


def _bug_task(pkg: dict[str, Any], rec: dict[str, Any]) -> RepoTask:
    original: dict[str, str] = pkg["files"]
    buggy = apply_patch(original, rec["bug_patch"])
    f2p = tuple(rec["FAIL_TO_PASS"])
    f2p_set = set(f2p)
    p2p = tuple(t for t in pkg["baseline_pass"] if t not in f2p_set)
    shown = "\n".join(f"  {t}" for t in f2p[:3]) + (
        f"\n  ... and {len(f2p) - 3} more" if len(f2p) > 3 else "")
    prompt = rec.get("prompt") or BUG_PROMPT.format(
        package=pkg["name"], version=pkg.get("version", "?"), n_fail=len(f2p), examples=shown)
    hidden = {p: original[p] for p in pkg["test_files"]}
    # helper modules of the test suite (conftest.py, tests/__init__.py, data) come back too
    for p, text in original.items():
        if any(p.startswith(d.rstrip("/") + "/") for d in pkg.get("test_dirs", ["tests"])):
            hidden.setdefault(p, text)
    return RepoTask(
        id=rec["id"],
        prompt=prompt,
        files=buggy,
        hidden_tests=hidden,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        reference_patch=diff_files(buggy, original),
        source="bugs",
        test_dirs=tuple(pkg.get("test_dirs", ["tests"])),
        metadata={k: rec[k] for k in ("package", "file", "function", "line", "mutation")
                  if k in rec} | {"version": pkg.get("version"), "license": pkg.get("license")},
    )


@cache
def shipped_bug_tasks() -> tuple[RepoTask, ...]:
    """The validated bug-injection tasks shipped in ``data/bugs/``."""
    tasks: list[RepoTask] = []
    for path in sorted(BUGS_DIR.glob("*.jsonl.gz")):
        tasks += bug_tasks_from_records(read_jsonl(path), str(path))
    return tuple(tasks)
