"""Coq proof tasks: the record, the bundled set and a loader for users' ``.v`` files.

A task is one theorem to prove: its *context* (the Coq text before it:
imports, definitions, proved lemmas), its *statement* (``Theorem name :
type.``) and, for bundled tasks, a *reference proof* (the tactic script that
goes between ``Proof.`` and ``Qed.``).

- :func:`bundled_tasks`: the theorems written for this project
  (``data/theorems.jsonl``: logic, booleans, natural numbers, lists, trees,
  inductive predicates, a small compiler; difficulty 1-3).
- :func:`load_jsonl`: tasks from a JSONL file of the same format.
- :func:`load_v_files`: every ``Admitted`` proof of a user's ``.v`` files
  becomes a task (no reference proof); see :func:`tasks_from_v`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sao_gym.envs.coq_proof.coqlex import CoqSyntaxError, split_sentences

DATA_DIR = Path(__file__).with_name("data")
BUNDLED_FILE = DATA_DIR / "theorems.jsonl"

THEOREM_KEYWORDS = ("Theorem", "Lemma", "Fact", "Remark", "Corollary", "Proposition",
                    "Property", "Example")
_DECL_RE = re.compile(
    r"^(?P<attrs>(?:#\[[^\]]*\]\s*)?(?:(?:Local|Global|Polymorphic|Monomorphic)\s+)*)"
    rf"(?P<kind>{'|'.join(THEOREM_KEYWORDS)})\s+(?P<name>[A-Za-z_][\w']*)(?P<sig>.*)$",
    re.DOTALL,
)
_END_RE = re.compile(r"^(Qed|Defined|Admitted|Abort(?:\s+All)?|Save\s+[\w']+)$")
_SCOPE_OPEN_RE = re.compile(
    r"^(?:Section\s+(?P<sec>[A-Za-z_][\w']*)\s*$"
    r"|Module\s+(?:Type\s+|Import\s+|Export\s+)?(?P<mod>[A-Za-z_][\w']*)(?P<rest>.*)$)",
    re.DOTALL,
)
_SCOPE_END_RE = re.compile(r"^End\s+(?P<name>[A-Za-z_][\w']*)\s*$")


@dataclass(frozen=True)
class CoqTask:
    """One theorem to prove."""

    id: str
    """Unique id, e.g. ``nat_double_plus`` or ``myfile:lemma_name``."""
    statement: str
    """The declaration shown to the model, e.g. ``Theorem t : forall n, n + 0 = n.``."""
    context: str = ""
    """Coq text that precedes the theorem (imports, definitions, proved lemmas)."""
    reference_proof: str | None = None
    """A tactic script that proves it (what goes between ``Proof.`` and ``Qed.``)."""
    difficulty: int | None = None
    """1 (a few tactics) to 3 (generalised induction, helper lemmas); None if unknown."""
    topic: str = ""
    """A short label: logic, bool, nat, list, tree, ..."""
    source: str = "bundled"
    """Where the task comes from (``bundled`` or a file path)."""
    epilogue: str = ""
    """Coq text the checker appends at the very end (``End S.`` for open sections)."""

    def __post_init__(self) -> None:
        parse_statement(self.statement)  # raises ValueError when malformed
        if not self.id or not isinstance(self.id, str):
            raise ValueError("a task needs a non-empty string id")
        if self.difficulty is not None and not (
            isinstance(self.difficulty, int) and 1 <= self.difficulty <= 3
        ):
            raise ValueError(f"task {self.id}: difficulty must be 1, 2, 3 or None, "
                             f"got {self.difficulty!r}")

    @property
    def name(self) -> str:
        """The theorem's name."""
        return parse_statement(self.statement)[1]

    @property
    def signature(self) -> str:
        """What follows the name in the statement: binders and ``: type``."""
        return parse_statement(self.statement)[2]

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON-serialisable), with ``name`` added."""
        return {**asdict(self), "name": self.name}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> CoqTask:
        """Build a task from a mapping with at least ``statement`` (and ``id``)."""
        if not isinstance(record, Mapping) or not isinstance(record.get("statement"), str):
            raise ValueError('a Coq task must be a mapping with a "statement" string')
        fields = {k: record[k] for k in cls.__dataclass_fields__ if k in record}
        fields.setdefault("id", parse_statement(record["statement"])[1])
        for key in ("context", "topic", "source", "epilogue"):
            if key in fields and not isinstance(fields[key], str):
                raise ValueError(f"task field {key!r} must be a string")
        if fields.get("reference_proof") is not None and not isinstance(
            fields["reference_proof"], str
        ):
            raise ValueError("task field 'reference_proof' must be a string or null")
        return cls(**fields)


def parse_statement(statement: str) -> tuple[str, str, str]:
    """Split ``Theorem name sig.`` into ``(kind, name, sig)``.

    Example:
        >>> parse_statement("Lemma foo (n : nat) : n = n.")
        ('Lemma', 'foo', '(n : nat) : n = n')

    Raises:
        ValueError: not one theorem-like declaration ending with ``.``.

    """
    if not isinstance(statement, str):
        raise ValueError("statement must be a string")
    try:
        sentences = split_sentences(statement)
    except CoqSyntaxError as e:
        raise ValueError(f"statement: {e}") from None
    if len(sentences) != 1 or not sentences[0].terminated:
        raise ValueError(f"statement must be exactly one Coq sentence ending with '.': "
                         f"{statement[:200]!r}")
    m = _DECL_RE.match(sentences[0].body)
    if m is None or m.group("attrs").strip():
        raise ValueError(f"statement must look like '<{'|'.join(THEOREM_KEYWORDS)}> name : "
                         f"type.', got {statement[:200]!r}")
    sig = m.group("sig").strip()
    if ":" not in sig:
        raise ValueError(f"statement has no ': type' part: {statement[:200]!r}")
    return m.group("kind"), m.group("name"), sig


# ----- bundled and JSONL tasks -------------------------------------------------------
def load_jsonl(path: str | Path, *, source: str | None = None) -> list[CoqTask]:
    """Tasks from a JSONL file: one object per line with the :class:`CoqTask` fields."""
    path = Path(path)
    tasks = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                task = CoqTask.from_dict(record)
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: {e}") from None
            if source is not None:
                task = CoqTask(**{**asdict(task), "source": source})
            tasks.append(task)
    _check_unique(tasks)
    return tasks


def bundled_tasks() -> list[CoqTask]:
    """The theorems shipped with the project, each with a reference proof."""
    return load_jsonl(BUNDLED_FILE, source="bundled")


def _check_unique(tasks: Iterable[CoqTask]) -> None:
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise ValueError(f"duplicate task id {task.id!r}")
        seen.add(task.id)


# ----- users' .v files ----------------------------------------------------------------
def tasks_from_v(text: str, *, source: str = "<string>", prefix: str = "") -> list[CoqTask]:
    """Every theorem of a ``.v`` text whose proof ends in ``Admitted.`` becomes a task.

    - The *context* of a task is the file's text before the theorem,
      verbatim: imports, definitions, proved lemmas, and earlier ``Admitted``
      lemmas too (they stay admitted: a proof that uses one depends on an
      axiom and scores 0; the model sees them marked ``Admitted``).
    - The partial proof before ``Admitted`` is dropped; the model writes the
      whole script. ``reference_proof`` is None.
    - A theorem inside open ``Section``/``Module`` blocks is checked inside
      them; the checker closes them after the theorem (``epilogue``).
    - Ids are ``<prefix><name>`` (``#2``, ``#3`` appended to repeated names).

    Raises:
        ValueError: the text cannot be lexed (unterminated comment or string).

    """
    try:
        sentences = split_sentences(text)
    except CoqSyntaxError as e:
        raise ValueError(f"{source}: {e}") from None
    tasks: list[CoqTask] = []
    scopes: list[str] = []
    counts: dict[str, int] = {}
    i = 0
    while i < len(sentences):
        body = sentences[i].body
        decl = _DECL_RE.match(body)
        if decl is None:
            _track_scopes(body, scopes)
            i += 1
            continue
        end = i + 1
        while end < len(sentences) and not _END_RE.match(_unbullet(sentences[end].body)):
            end += 1
        if end < len(sentences) and _unbullet(sentences[end].body) == "Admitted":
            name = decl.group("name")
            counts[name] = counts.get(name, 0) + 1
            suffix = "" if counts[name] == 1 else f"#{counts[name]}"
            statement = f"{decl.group('kind')} {name} {decl.group('sig').strip()}."
            try:
                tasks.append(CoqTask(
                    id=f"{prefix}{name}{suffix}",
                    statement=statement,
                    context=text[: sentences[i].start].rstrip() + "\n",
                    reference_proof=None,
                    difficulty=None,
                    topic="user",
                    source=source,
                    epilogue="".join(f"End {s}.\n" for s in reversed(scopes)),
                ))
            except ValueError:
                pass  # e.g. a statement without ': type' (Definition-like): not a task
        i = end + 1
    return tasks


def _unbullet(body: str) -> str:
    return body.lstrip("{}-+* \t\r\n")


def _track_scopes(body: str, scopes: list[str]) -> None:
    m = _SCOPE_OPEN_RE.match(body)
    if m is not None:
        if m.group("sec"):
            scopes.append(m.group("sec"))
        elif ":=" not in (m.group("rest") or ""):
            scopes.append(m.group("mod"))
        return
    m = _SCOPE_END_RE.match(body)
    if m is not None and m.group("name") in scopes:
        while scopes and scopes.pop() != m.group("name"):
            pass


def load_v_files(paths: str | Path | Iterable[str | Path]) -> list[CoqTask]:
    """Tasks from ``.v`` files (a file, a directory searched recursively, or a list).

    Ids are ``<file>:<theorem name>``, where ``<file>`` is the file's stem, or
    its path without ``.v`` relative to the directory it was found in.

    Raises:
        ValueError: a path does not exist, or no ``Admitted`` proof was found.

    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[tuple[Path, str]] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += [(f, f.relative_to(p).with_suffix("").as_posix())
                      for f in sorted(p.rglob("*.v"))]
        elif p.is_file():
            files.append((p, p.stem))
        else:
            raise ValueError(f"no such .v file or directory: {p}")
    tasks: list[CoqTask] = []
    for f, label in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        tasks += tasks_from_v(text, source=str(f), prefix=f"{label}:")
    if not tasks:
        raise ValueError(f"no theorem ending in 'Admitted.' found in "
                         f"{[str(f) for f, _ in files]}")
    _check_unique(tasks)
    return tasks
