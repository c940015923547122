"""``module:name`` references to objects of the user's code, imported with clear errors."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def import_reference(reference: str, *, what: str) -> Any:
    """The object ``reference`` names (``package.module:name``, ``name`` may be dotted).

    ``what`` says what it is for in errors: a ``ValueError`` for a malformed
    reference, an ``ImportError`` naming the reference for one that cannot be
    imported. A module found nowhere on ``sys.path`` is looked for in the
    current directory too, as ``python -m`` would (a console script does not
    put it there).
    """
    module, _, name = reference.partition(":") if isinstance(reference, str) else ("", "", "")
    parts = [*module.split("."), *name.split(".")]
    if not module or not name or not all(p.isidentifier() for p in parts):
        raise ValueError(f"{what} must be MODULE:NAME (for example my_agents.run:main), got "
                         f"{reference!r}")
    try:
        try:
            found: Any = importlib.import_module(module)
        except ModuleNotFoundError as e:
            here = os.getcwd()
            if e.name != module.split(".")[0] or here in sys.path:
                raise
            sys.path.append(here)
            found = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"{what} {reference!r} cannot be imported: {type(e).__name__}: {e}"
                          ) from e
    return found


__all__ = ["import_reference"]
