"""Rollouts kept on disk: append-only, size-bounded, readable after a ``kill -9``.

A run keeps what its agents did under ``RUN_DIR/rollouts/``, one directory a
*split* (``train``, ``eval_before``, ``eval_after``, or any name ``sao-gym
eval`` is given). A split is a sequence of *segments*, each two files::

    rollouts/train/000001.jsonl        one rollout record a line (docs/metrics.md)
    rollouts/train/000001.index.jsonl  one summary a line: id, where its record is,
                                       and the fields the viewer filters and sorts by

:class:`RolloutWriter` appends a record (one ``write`` of the whole line),
then its index line; a reader trusts only index lines that end in a newline
and whose record they point at lies whole inside the data file, so a write
torn by a ``kill -9`` is invisible, never an error. A writer never appends to
a segment an earlier process left (it may end in a torn line): it starts the
next one. A segment is closed at ``segment_bytes``; when a split's segments
pass ``max_bytes`` the oldest are deleted (rotation), so a long run's
rollouts take bounded space.

:func:`rollout_record` turns a :class:`~sao_gym.types.Rollout` (and the
learner's per-token quantities of the step that trained it, if traced) into
a record; :class:`RolloutReader` lists a run's splits and episodes and reads
one record back.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao_gym.types import Rollout

ROLLOUTS_DIR = "rollouts"
"""Where a run's rollouts live, under its run directory."""

DECIMALS = 4
"""Decimal places kept of per-token floats (logprobs, ratios, advantages, values)."""

LEARNER_KEYS = ("logprob", "ratio", "dis_mask", "advantage", "value", "return")
"""The learner's per-token quantities a traced training record carries (any subset)."""

SUMMARY_KEYS = ("step", "reward", "stop_reason", "env_id", "task_id", "seed", "truncated",
                "infra_failure", "turns", "tokens", "action_tokens", "traced")
"""Fields of an index line besides ``id``, ``off`` and ``len`` (what the viewer's list
shows, filters and sorts by; the fewer, the faster a reader loads 100,000 of them)."""

_SPLIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SEGMENT = re.compile(r"^(\d{6})\.jsonl$")


def check_split(name: str) -> str:
    """``name`` if it is a valid split name (letters, digits, ``_.-``; no path), else ValueError."""
    if not isinstance(name, str) or not _SPLIT.match(name):
        raise ValueError(f"a rollout split name is 1-64 letters, digits, '_', '.' or '-' and "
                         f"starts with a letter or digit; got {name!r}")
    return name


def _floats(values: Iterable[float], decimals: int = DECIMALS) -> list[float | None]:
    """Rounded floats; a non-finite value becomes ``None`` (JSON has no NaN)."""
    return [round(v, decimals) if math.isfinite(v) else None for v in map(float, values)]


def rollout_record(rollout: Rollout, *, split: str, step: int | None = None,
                   learner: Mapping[str, Sequence[float]] | None = None,
                   learner_step: int | None = None,
                   token_text: Sequence[str] | None = None) -> dict[str, Any]:
    """The stored record of ``rollout`` (without its ``id``: the writer gives one).

    ``step``: the learner step it belongs to (the step that trained it, or the
    checkpoint an evaluation played). ``learner``: the learner's per-token
    quantities (:data:`LEARNER_KEYS`, each as long as ``token_ids``) at
    ``learner_step``. ``token_text``: each token's text, for the viewer.
    """
    n = len(rollout.token_ids)
    if token_text is not None and len(token_text) != n:
        raise ValueError(f"token_text has {len(token_text)} entries for {n} tokens")
    tokens: dict[str, Any] = {
        "id": list(rollout.token_ids), "mask": list(rollout.loss_mask),
        "sampler_logprob": _floats(rollout.rollout_logprobs),
        "policy_version": list(rollout.policy_versions)}
    if token_text is not None:
        tokens["text"] = list(token_text)
    record: dict[str, Any] = {
        "split": split, "step": step, "env_id": rollout.env_id, "task_id": rollout.task_id,
        "seed": rollout.seed, "reward": _floats([rollout.reward], 6)[0],
        "stop_reason": rollout.stop_reason.value, "terminated": rollout.terminated,
        "truncated": rollout.truncated, "infra_failure": rollout.infra_failure,
        "group_id": rollout.group_id, "policy_version": rollout.start_version,
        "metrics": {k: _floats([v], 6)[0] for k, v in rollout.metrics.items()},
        "messages": list(rollout.messages), "tokens": tokens, "time": round(time.time(), 3)}
    if rollout.segment_starts:
        record["segments"] = list(rollout.segment_starts)
    if learner:
        unknown = sorted(set(learner) - set(LEARNER_KEYS))
        if unknown:
            raise ValueError(f"unknown learner quantities {unknown}; known: {LEARNER_KEYS}")
        short = {k: len(v) for k, v in learner.items() if len(v) != n}
        if short:
            raise ValueError(f"learner quantities must have one value a token ({n}); got {short}")
        record["learner"] = {"step": learner_step, **{
            k: (list(map(int, v)) if k == "dis_mask" else _floats(v)) for k, v in learner.items()}}
    return record


def summary_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The index fields (:data:`SUMMARY_KEYS`) of a record."""
    mask = record["tokens"]["mask"]
    return {"step": record.get("step"), "reward": record.get("reward"),
            "stop_reason": record.get("stop_reason"), "env_id": record.get("env_id"),
            "task_id": record.get("task_id"), "seed": record.get("seed"),
            "truncated": bool(record.get("truncated")),
            "infra_failure": bool(record.get("infra_failure")),
            "turns": record.get("metrics", {}).get("turns"), "tokens": len(mask),
            "action_tokens": sum(1 for m in mask if m), "traced": "learner" in record}


def _segments(directory: Path) -> list[int]:
    """Numbers of the data segments in ``directory``, ascending."""
    if not directory.is_dir():
        return []
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := _SEGMENT.match(p.name)))


def _complete_lines(data: bytes) -> list[bytes]:
    """The newline-terminated, non-blank lines of ``data`` (a torn tail is dropped)."""
    lines = data.split(b"\n")
    lines.pop()
    return [line for line in lines if line.strip()]


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode("utf-8") + b"\n"


class RolloutWriter:
    """Appends records to one split of a run (module docs); one writer per split at a time.

    Args:
        run_dir: the run directory (the split lives in ``run_dir/rollouts/<split>``).
        split: the split's name (:func:`check_split`).
        segment_bytes: a segment is closed once its data file reaches this size.
        max_bytes: the split's segments are kept under this total (oldest deleted
            first; the open segment is never deleted). ``None``: unbounded.

    """

    def __init__(self, run_dir: str | os.PathLike[str], split: str, *,
                 segment_bytes: int = 64 << 20, max_bytes: int | None = 1 << 30):
        if segment_bytes < 1 or (max_bytes is not None and max_bytes < segment_bytes):
            raise ValueError(f"need 1 <= segment_bytes <= max_bytes; got {segment_bytes}, "
                             f"{max_bytes}")
        self.split = check_split(split)
        self.dir = Path(run_dir) / ROLLOUTS_DIR / split
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes, self.max_bytes = segment_bytes, max_bytes
        existing = _segments(self.dir)
        self.next_id = _last_id(self.dir, existing) + 1
        """Id of the next record (ids count up over the split's life, rotation included)."""
        self._segment = (existing[-1] if existing else 0) + 1
        self._data = self._index = None
        self._size = 0
        self.written = 0
        """Records this writer wrote."""
        self.bytes_written = 0
        """Bytes of records (data lines) this writer wrote."""

    def _open(self) -> None:
        base = self.dir / f"{self._segment:06d}"
        self._data = open(base.with_suffix(".jsonl"), "ab")
        self._index = open(base.with_suffix(".index.jsonl"), "ab")
        self._size = 0

    def _close_segment(self) -> None:
        for f in (self._data, self._index):
            if f is not None:
                f.close()
        self._data = self._index = None

    def write(self, record: Mapping[str, Any]) -> int:
        """Append ``record`` (:func:`rollout_record`); returns its id."""
        if self._data is not None and self._size >= self.segment_bytes:
            self._close_segment()
            self._segment += 1
        if self._data is None:
            self._open()
            self._rotate()
        rid = self.next_id
        line = _dumps({"id": rid, **record})
        offset = self._size
        self._data.write(line)  # the whole line in one write, then its index line
        self._data.flush()
        self._size += len(line)
        self._index.write(_dumps({"id": rid, "off": offset, "len": len(line),
                                  **summary_of(record)}))
        self._index.flush()
        self.next_id += 1
        self.written += 1
        self.bytes_written += len(line)
        return rid

    def write_all(self, records: Iterable[Mapping[str, Any]]) -> list[int]:
        """:meth:`write` each record; their ids."""
        return [self.write(r) for r in records]

    def _rotate(self) -> None:
        """Delete the oldest closed segments while the split is over ``max_bytes``."""
        if self.max_bytes is None:
            return
        sizes = {s: sum(p.stat().st_size for p in self._files(s) if p.exists())
                 for s in _segments(self.dir)}
        total = sum(sizes.values())
        for s in sorted(sizes):
            if total <= self.max_bytes - self.segment_bytes or s == self._segment:
                break
            for p in self._files(s):
                p.unlink(missing_ok=True)
            total -= sizes[s]

    def _files(self, segment: int) -> tuple[Path, Path]:
        base = self.dir / f"{segment:06d}"
        return base.with_suffix(".jsonl"), base.with_suffix(".index.jsonl")

    def close(self) -> None:
        """Close the open segment."""
        self._close_segment()

    def __enter__(self) -> RolloutWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _last_id(directory: Path, segments: Sequence[int]) -> int:
    """The largest id in the split's index files (-1 when none)."""
    for s in reversed(segments):
        lines = _complete_lines((directory / f"{s:06d}.index.jsonl").read_bytes()
                                if (directory / f"{s:06d}.index.jsonl").exists() else b"")
        for line in reversed(lines):
            try:
                return int(json.loads(line)["id"])
            except (ValueError, KeyError, TypeError):
                continue
    return -1


PARSE_CHUNK = 4096
"""Index lines parsed by one ``json.loads`` (a reader thread lets others run in between)."""


@dataclass
class _SplitIndex:
    """What a reader has read of one split's index files (read on from where it stopped).

    ``lines`` are the raw index lines in write order, ``parsed`` their entries as
    far as they were needed: the first page of a split and its facets need no
    parse of the rest.
    """

    lines: list[bytes] = field(default_factory=list)
    segs: list[int] = field(default_factory=list)
    parsed: list[dict[str, Any] | None] = field(default_factory=list)  # None: not yet
    read_to: dict[int, int] = field(default_factory=dict)
    """Bytes of each segment's index file consumed (whole lines only)."""
    distinct: dict[str, tuple[int, set[str]]] = field(default_factory=dict)
    """Per field: how many lines were scanned, and the values seen."""


class RolloutReader:
    """Reads the rollouts of one run directory, while it is being written too.

    Each call reads the split's index files on from where the last stopped
    (what was appended since), skipping a torn last line; entries of segments
    rotated away disappear. Lines are parsed when first needed: :meth:`count`,
    :meth:`page` (entries in write order) and :meth:`values` (the distinct values
    of a field) parse only what they return, :meth:`episodes` everything. Not
    thread-safe: one thread at a time per reader.
    """

    def __init__(self, run_dir: str | os.PathLike[str]):
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / ROLLOUTS_DIR
        self._splits: dict[str, _SplitIndex] = {}

    def splits(self) -> list[str]:
        """The run's split names (``train`` first, then the others by name)."""
        if not self.root.is_dir():
            return []
        names = [p.name for p in self.root.iterdir() if p.is_dir() and _SPLIT.match(p.name)]
        return sorted(names, key=lambda n: (n != "train", n))

    def _read(self, split: str) -> _SplitIndex:
        """The split's index, read on to the end of its files."""
        check_split(split)
        directory = self.root / split
        state = self._splits.setdefault(split, _SplitIndex())
        present = set(_segments(directory))
        if any(s not in present for s in state.read_to):  # rotated away
            keep = [i for i, s in enumerate(state.segs) if s in present]
            state.lines = [state.lines[i] for i in keep]
            state.segs = [state.segs[i] for i in keep]
            state.parsed = [state.parsed[i] for i in keep]
            state.read_to = {s: n for s, n in state.read_to.items() if s in present}
            state.distinct = {}
        for s in sorted(present):
            try:
                with open(directory / f"{s:06d}.index.jsonl", "rb") as f:
                    f.seek(state.read_to.get(s, 0))
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1  # whole lines only: a torn tail is read next time
            if not end:
                continue
            state.read_to[s] = state.read_to.get(s, 0) + end
            new = _complete_lines(data[:end])
            state.lines += new
            state.segs += [s] * len(new)
            state.parsed += [None] * len(new)
        return state

    def _parse(self, state: _SplitIndex, start: int, stop: int) -> bool:
        """Parse lines ``[start, stop)`` not parsed yet; drop malformed ones (then True)."""
        todo = [i for i in range(start, min(stop, len(state.lines))) if state.parsed[i] is None]
        bad = []
        for k in range(0, len(todo), PARSE_CHUNK):
            chunk = todo[k:k + PARSE_CHUNK]
            for i, e in zip(chunk, _parse_lines([state.lines[i] for i in chunk]), strict=True):
                if e is None:
                    bad.append(i)
                else:
                    e["seg"] = state.segs[i]
                    state.parsed[i] = e
        for i in reversed(bad):  # a line that is no entry (damage from outside): gone
            del state.lines[i], state.segs[i], state.parsed[i]
        return bool(bad)

    def count(self, split: str) -> int:
        """How many entries the split has (lines not parsed yet counted as entries)."""
        return len(self._read(split).lines)

    def page(self, split: str, start: int, stop: int, *, reverse: bool = False
             ) -> list[dict[str, Any]]:
        """Entries ``[start, stop)`` in write order (``reverse``: newest first)."""
        state = self._read(split)
        while True:
            n = len(state.lines)
            lo, hi = (max(0, n - stop), max(0, n - start)) if reverse else (start, min(stop, n))
            if not self._parse(state, lo, hi):
                break
        rows = state.parsed[lo:hi]
        return rows[::-1] if reverse else rows

    def episodes(self, split: str) -> list[dict[str, Any]]:
        """Every index entry of the split in write order.

        Each has ``id``, ``seg``, ``off``, ``len`` and the summary of :data:`SUMMARY_KEYS`.
        """
        state = self._read(split)
        self._parse(state, 0, len(state.lines))
        return state.parsed

    def values(self, split: str, key: str) -> list[str]:
        """The distinct values of string field ``key`` over the split, sorted.

        Found in the raw lines (a field's key is written before any string that
        could hold it, and a quote inside a string is always escaped), so no line
        is parsed.
        """
        state = self._read(split)
        scanned, seen = state.distinct.get(key, (0, set()))
        if scanned < len(state.lines):
            pattern = re.compile(rb'"' + re.escape(key.encode()) + rb'":"((?:[^"\\]++|\\.)*+)"')
            found = set(pattern.findall(b"\n".join(state.lines[scanned:])))
            seen |= {json.loads(b'"' + v + b'"') for v in found}
            state.distinct[key] = (len(state.lines), seen)
        return sorted(seen)

    def entry(self, split: str, rid: int) -> dict[str, Any] | None:
        """The index entry of record ``rid`` of ``split``, or None."""
        state = self._read(split)
        if not state.lines:
            return None
        while self._parse(state, 0, 1):
            pass
        if not state.lines:
            return None
        i = rid - state.parsed[0]["id"]  # ids count up by one from the oldest line kept
        if 0 <= i < len(state.lines) and not self._parse(state, i, i + 1) \
                and state.parsed[i]["id"] == rid:
            return state.parsed[i]
        if i < 0:
            return None
        # a dropped line, or ids that do not count up: look the id up
        return next((e for e in self.episodes(split) if e["id"] == rid), None)

    def read_bytes(self, split: str, rid: int) -> bytes | None:
        """The stored JSON line of record ``rid`` (None: no such record, or torn)."""
        e = self.entry(split, rid)
        if e is None:
            return None
        path = self.root / split / f"{e['seg']:06d}.jsonl"
        try:
            with open(path, "rb") as f:
                f.seek(e["off"])
                data = f.read(e["len"])
        except FileNotFoundError:  # rotated away meanwhile
            return None
        if len(data) != e["len"] or not data.endswith(b"\n"):
            return None
        return data

    def record(self, split: str, rid: int) -> dict[str, Any] | None:
        """Record ``rid`` of ``split`` as a dict (None: no such record)."""
        data = self.read_bytes(split, rid)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    def records(self, split: str, where: Callable[[dict[str, Any]], bool] | None = None
                ) -> Iterable[dict[str, Any]]:
        """Every readable record of ``split`` in write order (``where``: filters index entries)."""
        for e in list(self.episodes(split)):
            if where is None or where(e):
                rec = self.record(split, e["id"])
                if rec is not None:
                    yield rec


def _parse_lines(lines: list[bytes]) -> list[dict[str, Any] | None]:
    """Index entries of ``lines`` (None for a line that is not a valid entry)."""
    try:  # one parse for the common case
        entries = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        entries = []
        for line in lines:
            try:
                entries.append(json.loads(line))
            except ValueError:
                entries.append(None)
    return [e if isinstance(e, dict) and all(isinstance(e.get(k), int)
                                             for k in ("id", "off", "len")) else None
            for e in entries]
