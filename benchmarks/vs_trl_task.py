"""The task of benchmarks/vs_trl.py, shared by both sides: problems, splits, the reward.

Standard library only: the TRL runner (benchmarks/vs_trl_runner.py, in the TRL
venv) imports it as well as the SAO environment, so both score completions
with the same :func:`score`.
"""

from __future__ import annotations

import functools
import random
from typing import Any

OPERATORS = ("+", "-")
OPERANDS = range(1, 21)
HELDOUT_SIZE = 200
SPLIT_SEED = 20_240_601
"""Seeds the shuffle that sets the held-out problems aside (fixed for every run)."""
PROMPT = "What is {a} {op} {b}? Answer with the number in <answer></answer>."
SPLITS = ("train", "heldout")

MAX_NEW_TOKENS = 40
"""Most new tokens per completion, both sides."""


def score(text: str, answer: str) -> float:
    """1.0: the first <answer>...</answer> holds the right integer; 0.1: tags, wrong; 0: none."""
    start = text.find("<answer>")
    end = text.find("</answer>", start + 8) if start >= 0 else -1
    if end < 0:
        return 0.0
    given = text[start + 8:end].strip()
    digits = given[1:] if given[:1] in ("+", "-") else given
    if digits.isascii() and digits.isdigit() and len(digits) <= 6 and int(given) == int(answer):
        return 1.0
    return 0.1


def make_task(a: int, op: str, b: int) -> dict[str, Any]:
    """The task dict of one problem: id, prompt, answer (a string) and its operands."""
    if op not in OPERATORS or a not in OPERANDS or b not in OPERANDS:
        raise ValueError(f"a task is a, op, b with a and b in 1..20 and op in {OPERATORS}; "
                         f"got {a!r} {op!r} {b!r}")
    result = a + b if op == "+" else a - b
    return {"id": f"{a}{op}{b}", "a": a, "op": op, "b": b,
            "prompt": PROMPT.format(a=a, op=op, b=b), "answer": str(result)}


@functools.lru_cache(maxsize=1)
def _splits() -> dict[str, tuple[dict[str, Any], ...]]:
    problems = [(a, op, b) for a in OPERANDS for op in OPERATORS for b in OPERANDS]
    random.Random(SPLIT_SEED).shuffle(problems)
    tasks = [make_task(*p) for p in problems]
    return {"heldout": tuple(tasks[:HELDOUT_SIZE]), "train": tuple(tasks[HELDOUT_SIZE:])}


def _split(split: str) -> tuple[dict[str, Any], ...]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return _splits()[split]


def split_tasks(split: str) -> list[dict[str, Any]]:
    """The tasks of ``split`` ("train": 600, "heldout": 200), in a fixed order.

    Built once per process; each call returns fresh copies.
    """
    return [dict(t) for t in _split(split)]


def split_size(split: str) -> int:
    """``len(split_tasks(split))`` without copying the tasks."""
    return len(_split(split))


def split_task(split: str, index: int) -> dict[str, Any]:
    """``split_tasks(split)[index]`` (a fresh copy) without copying the others."""
    return dict(_split(split)[index])
