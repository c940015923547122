r"""Task sources of ``sao_gym/MathTIR-v0``: reasoning-gym generators and data files.

A task is a dict: ``id``, ``prompt`` (the question shown to the model),
``answer`` (the reference, never shown), ``grader`` (``math_verify`` or
``scorer``) and, for generated tasks, ``generator``, ``index``,
``generator_options`` and ``metadata`` (what the generator's scorer needs).

- :class:`ReasoningGymTasks`: procedural tasks from the ``reasoning-gym``
  wheel, offline. Task ``index`` of generator ``name`` is the same on every
  machine for a given ``data_seed``.
- :func:`load_tasks`: question/answer records from a JSONL file (stdlib
  only) or, through Hugging Face ``datasets`` (imported only then), from
  Parquet/CSV/Arrow files and ``save_to_disk`` directories. GSM8K answers
  (``... #### 72``) and MATH solutions (``... \boxed{...}``) are reduced to
  the final answer.

Grading of generated tasks: generators in :data:`MATH_VERIFY_GENERATORS`
(reviewed: their references are exact integers) are graded by
math-verify, so ``72``, ``72.0``, ``\boxed{72}`` and ``72 apples`` all
count. Every other generator (answers that are expressions, lists,
factorisations, numbers with a required precision or form, words) is
graded by its own ``score_answer``, which knows its rules (countdown
accepts any expression that reaches the target; fraction_simplification
wants lowest terms); only a full score (1.0) counts as correct.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sao_gym.envs.math_tir.verify import extract_boxed
from sao_gym.registration import import_optional
from sao_gym.utils.jsonl import read_jsonl

logger = logging.getLogger(__name__)

DEFAULT_GENERATORS = ("gsm_symbolic", "basic_arithmetic", "chain_sum")
"""The default mix: grade-school word problems and arithmetic, all integer answers."""

MATH_VERIFY_GENERATORS = frozenset({
    "gsm_symbolic", "basic_arithmetic", "chain_sum", "products", "gcd", "lcm",
    "leg_counting", "simple_equations",
})
"""Generators graded by math-verify (the rest use their own ``score_answer``)."""

ANSWER_FORMATS = ("auto", "gsm8k", "boxed", "math", "plain")


def reasoning_gym_names() -> list[str]:
    """Names of all reasoning-gym generators (imports ``reasoning_gym``, ~1.5 s)."""
    factory = import_optional("reasoning_gym.factory", needed_by="MathTIR (reasoning-gym tasks)")

    return sorted(factory.DATASETS)


class ReasoningGymTasks:
    """Tasks drawn from reasoning-gym generators.

    Args:
        generators: generator names (e.g. ``gsm_symbolic``, ``chain_sum``).
        data_seed: the seed of every generator's dataset.
        size: indices per generator (a task is ``(generator, index)``).
        configs: per-generator keyword arguments of its config
            (``{"chain_sum": {"min_terms": 3}}``).

    Raises:
        ValueError: unknown generator names or bad configs.

    """

    def __init__(
        self,
        generators: Sequence[str] = DEFAULT_GENERATORS,
        *,
        data_seed: int = 0,
        size: int = 100_000,
        configs: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        if isinstance(generators, str) or not generators:
            raise ValueError(f"generators must be a non-empty list of names, got {generators!r}")
        if not 1 <= size <= 10_000_000:
            raise ValueError(f"size must be in [1, 10_000_000], got {size}")
        configs = dict(configs or {})
        names = reasoning_gym_names()
        for name in list(generators) + list(configs):
            if name not in names:
                close = difflib.get_close_matches(str(name), names, n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise ValueError(f"unknown reasoning-gym generator {name!r}{hint}; "
                                 f"{len(names)} exist, e.g. {', '.join(DEFAULT_GENERATORS)}")
        extra = set(configs) - set(generators)
        if extra:
            raise ValueError(f"configs for generators not in use: {sorted(extra)}")
        self.generators = tuple(generators)
        self.data_seed = int(data_seed)
        self.size = int(size)
        self._options = {n: {**dict(configs.get(n, {})), "seed": self.data_seed,
                             "size": self.size} for n in self.generators}
        self._datasets = {n: self._make(n) for n in self.generators}

    def _make(self, name: str) -> Any:
        reasoning_gym = import_optional("reasoning_gym", needed_by="MathTIR (reasoning-gym tasks)")

        try:
            return reasoning_gym.create_dataset(name, **self._options[name])
        except (TypeError, ValueError, AssertionError, KeyError) as e:
            reason = str(e) or type(e).__name__
            raise ValueError(f"bad config for generator {name!r}: {reason}") from None

    def task(self, generator: str, index: int) -> dict[str, Any]:
        """Task ``index`` of ``generator``."""
        if generator not in self._datasets:
            raise ValueError(f"generator {generator!r} is not one of {list(self.generators)}")
        if not 0 <= index < self.size:
            raise ValueError(f"index must be in [0, {self.size}), got {index}")
        entry = self._datasets[generator][int(index)]
        return {
            "id": f"rg:{generator}:{self.data_seed}:{index}",
            "prompt": str(entry["question"]),
            "answer": str(entry["answer"]),
            "grader": "math_verify" if generator in MATH_VERIFY_GENERATORS else "scorer",
            "generator": generator,
            "index": int(index),
            "generator_options": dict(self._options[generator]),
            "metadata": entry.get("metadata", {}),
        }

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        """A task chosen by ``rng`` (a generator, then an index)."""
        generator = self.generators[int(rng.integers(len(self.generators)))]
        return self.task(generator, int(rng.integers(self.size)))


# ---------------------------------------------------------------------------------------------
# data files
# ---------------------------------------------------------------------------------------------
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}\b)")


def extract_reference(text: Any, answer_format: str = "auto") -> str | None:
    r"""The final answer in a dataset's answer field, or ``None`` if there is none.

    ``gsm8k``: what follows the last ``####`` (thousands commas dropped);
    ``boxed``/``math``: the last ``\boxed{...}``; ``plain``: the text;
    ``auto``: ``####`` if present, else a ``\boxed{}`` if present, else plain.

    >>> extract_reference("She pays 3*4 = 12. #### 1,200")
    '1200'
    >>> extract_reference(r"so $x = \boxed{\frac{1}{2}}$.")
    '\\frac{1}{2}'
    >>> extract_reference(204)
    '204'
    """
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
    if text is None:
        return None
    text = str(text)
    fmt = answer_format
    if fmt == "auto":
        fmt = "gsm8k" if "####" in text else ("boxed" if "\\boxed" in text else "plain")
    if fmt == "gsm8k":
        if "####" not in text:
            return None
        answer = _THOUSANDS_RE.sub("", text.rsplit("####", 1)[1].strip()).rstrip(".").strip()
    elif fmt in ("boxed", "math"):
        answer = extract_boxed(text)
    else:
        answer = text.strip()
    return answer or None


def _read_records(path: Path, split: str) -> list[dict[str, Any]]:
    name = path.name.lower()
    if path.is_file() and name.endswith((".jsonl", ".jsonl.gz")):
        return [record for _, record in read_jsonl(path)]
    if path.is_file() and name.endswith(".json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise ValueError(f"{path}: a .json data file must hold a list of objects")
        return data
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"reading {path.name} needs the Hugging Face `datasets` package "
            "(pip install datasets); JSONL files (.jsonl, .jsonl.gz) and .json lists "
            "work without it"
        ) from None
    if path.is_dir():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"{path}: no split {split!r}; splits: {sorted(ds)}")
            ds = ds[split]
    else:
        builders = {".parquet": "parquet", ".csv": "csv", ".arrow": "arrow", ".tsv": "csv"}
        builder = builders.get(path.suffix.lower())
        if builder is None:
            raise ValueError(f"{path}: unsupported data file type; use .jsonl, .json, "
                             f"{', '.join(builders)} or a datasets directory")
        kwargs = {"delimiter": "\t"} if path.suffix.lower() == ".tsv" else {}
        ds = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
    return [dict(r) for r in ds]


def load_tasks(
    path: str | Path,
    *,
    question_key: str = "question",
    answer_key: str = "answer",
    answer_format: str = "auto",
    id_key: str | None = None,
    split: str = "train",
) -> list[dict[str, Any]]:
    r"""Math tasks from a data file with question/answer columns.

    JSONL (``.jsonl``, ``.jsonl.gz``) and ``.json`` lists need nothing
    extra; Parquet, CSV, Arrow and ``datasets.save_to_disk`` directories
    need Hugging Face ``datasets``. Column names are configurable: GSM8K is
    ``question``/``answer`` (``answer_format="gsm8k"``), MATH is
    ``problem``/``solution`` (``"boxed"``), AIME-style files
    ``problem``/``answer`` (``"plain"``). Records whose reference cannot be
    extracted are skipped with a warning.

    Raises:
        ValueError: a missing file or column, no usable record.
        ImportError: a non-JSON file without ``datasets`` installed.

    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"data file {str(path)!r} does not exist")
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
    records = _read_records(path, split)
    tasks, skipped = [], 0
    for i, record in enumerate(records):
        for key in (question_key, answer_key) + ((id_key,) if id_key else ()):
            if key not in record:
                raise ValueError(f"{path}: record {i} has no {key!r} column; columns: "
                                 f"{sorted(record)[:20]} (set question_key/answer_key)")
        answer = extract_reference(record[answer_key], answer_format)
        question = record[question_key]
        if answer is None or not isinstance(question, str) or not question.strip():
            skipped += 1
            continue
        tasks.append({
            "id": str(record[id_key]) if id_key else f"{path.name}:{i}",
            "prompt": question,
            "answer": answer,
            "grader": "math_verify",
            "source": str(path),
        })
    if skipped:
        logger.warning("%s: skipped %d of %d records without a usable question/answer",
                       path, skipped, len(records))
    if not tasks:
        raise ValueError(f"{path}: no usable question/answer records")
    return tasks


def task_from_dict(task: Any) -> dict[str, Any]:
    """A task from ``options={"task": {...}}``: ``prompt`` (or ``question``) and ``answer``."""
    if not isinstance(task, Mapping):
        raise ValueError('options["task"] must be a dict with "prompt" and "answer"')
    prompt = task.get("prompt", task.get("question"))
    answer = task.get("answer")
    if not isinstance(prompt, str) or not prompt.strip() or answer is None or not str(answer):
        raise ValueError('options["task"] needs a non-empty "prompt" (or "question") and "answer"')
    return {
        "id": str(task.get("id") or "custom:" + hashlib.sha1(
            f"{prompt}\x00{answer}".encode("utf-8", "replace")).hexdigest()[:12]),
        "prompt": prompt,
        "answer": str(answer),
        "grader": "math_verify",
    }
