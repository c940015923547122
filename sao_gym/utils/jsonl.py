"""Reading JSONL files (a JSON object a line, maybe gzipped); errors name the line."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    r"""``(line number, object)`` for each non-blank line of ``path`` (``.gz``: gzipped).

    Raises ``ValueError`` naming ``path:line`` for a line that is not JSON or
    not a JSON object.

    >>> import tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "a.jsonl")
    >>> _ = open(f, "w").write('{"x": 1}\n\n{"x": 2}\n')
    >>> list(read_jsonl(f))
    [(1, {'x': 1}), (3, {'x': 2})]
    """
    path = Path(path)
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({e})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{line_no}: each line must be a JSON object")
            yield line_no, record
