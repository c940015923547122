"""Running tests in a sandbox and grading with SWE-bench semantics.

- :func:`run_builtin` / :func:`run_pytest` run test files in a sandbox and
  return one outcome per test id: with the stdlib runner (:mod:`.testrunner`,
  passed to ``python3 -s -B -c`` with ``PYTHONHASHSEED=0``, so nothing is
  written into the repository) or with pytest (``-rA`` summary lines, as in
  SWE-bench logs).
- :func:`score`: reward 1 when every ``FAIL_TO_PASS`` test passes and every
  ``PASS_TO_PASS`` test still passes; with partial credit, the product of the
  two pass fractions (so doing nothing still scores 0).

A test counts as passing when its outcome is ``passed`` or ``xfailed``
(as SWE-bench counts ``PASSED`` and ``XFAIL``); a test that is missing from
the run (deleted, not collected, killed by a timeout) counts as failing.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sao_gym.sandbox.base import ExecResult, Sandbox

RUNNER_SOURCE = Path(__file__).with_name("testrunner.py").read_text(encoding="utf-8")
"""The stdlib test runner's source, run as ``python3 -s -B -c RUNNER_SOURCE``."""
PASSING = frozenset({"passed", "xfailed"})
"""Outcomes that count as a pass."""
PYTHON = "python3"


@dataclass(frozen=True)
class TestRun:
    """What one run of tests gave."""

    outcomes: dict[str, str]
    """Test id -> outcome (``passed``, ``failed``, ``error``, ``skipped``, ``xfailed``, ...)."""
    messages: dict[str, str] = field(default_factory=dict)
    """Test id -> failure message (tracebacks, cut)."""
    collect_errors: dict[str, str] = field(default_factory=dict)
    """Test file -> why it could not be imported."""
    timed_out: bool = False
    """The whole run hit its time limit (the tests not reported count as failing)."""
    exit_code: int = 0
    stderr: str = ""
    duration_s: float = 0.0

    def counts(self) -> Counter:
        """How many tests had each outcome."""
        return Counter(self.outcomes.values())

    def summary(self, limit: int = 6000, max_failures: int = 10) -> str:
        """A report for the agent: counts, then the first failures with their messages."""
        counts = self.counts()
        order = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
        parts = [f"{counts[k]} {k}" for k in order if counts.get(k)]
        head = ", ".join(parts) if parts else "no tests ran"
        if self.collect_errors:
            head += f", {len(self.collect_errors)} file(s) could not be imported"
        lines = [head + (f" in {self.duration_s:.1f} s" if self.duration_s else "")]
        if self.timed_out:
            lines.append("The test run hit its time limit; unreported tests count as failed.")
        for path, message in list(self.collect_errors.items())[:max_failures]:
            lines += [f"\nERROR collecting {path}:", _tail(message, 1200)]
        bad = [t for t, o in self.outcomes.items() if o in ("failed", "error")]
        for tid in bad[:max_failures]:
            lines += [f"\n{self.outcomes[tid].upper()} {tid}",
                      _tail(self.messages.get(tid, ""), 1200)]
        if len(bad) > max_failures:
            lines.append(f"\n... and {len(bad) - max_failures} more failing tests")
        if not self.outcomes and not self.collect_errors and self.stderr.strip():
            lines += ["\nstderr:", _tail(self.stderr, 2000)]
        text = "\n".join(lines)
        return text if len(text) <= limit else text[:limit] + "\n... [report cut]"


def _tail(text: str, n: int) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


# ----- the stdlib runner ---------------------------------------------------------------------
def runner_spec(root: str, targets: Sequence[str], *, select: Sequence[str] | None = None,
                timeout_per_test: float = 10.0, conftest: bool | Sequence[str] = True,
                nonce: str | None = None) -> dict:
    """The JSON spec the stdlib runner reads from stdin."""
    return {"root": root, "targets": list(targets), "select": list(select) if select else None,
            "timeout": timeout_per_test, "conftest": conftest if conftest is True
            else list(conftest or []), "nonce": nonce or secrets.token_hex(12)}


def parse_runner_output(stdout: str, nonce: str) -> TestRun:
    """Outcomes from the runner's output: only lines carrying ``nonce`` count."""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    errors: dict[str, str] = {}
    done = False
    prefix = nonce + " "
    for line in stdout.splitlines():
        if not line.startswith(prefix):
            continue
        try:
            rec = json.loads(line[len(prefix):])
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        if rec.get("done"):
            done = True
            continue
        tid, outcome = rec.get("id"), rec.get("outcome")
        if not isinstance(tid, str) or not isinstance(outcome, str):
            continue
        if rec.get("collect"):
            errors[tid] = str(rec.get("message", ""))
            continue
        outcomes[tid] = outcome
        if rec.get("message"):
            messages[tid] = str(rec["message"])
    return TestRun(outcomes, messages, errors, timed_out=not done)


async def run_builtin(sandbox: Sandbox, root: str, targets: Sequence[str], *,
                      select: Sequence[str] | None = None, timeout_s: float = 120.0,
                      timeout_per_test: float = 10.0, conftest: bool | Sequence[str] = True,
                      discover: Sequence[str] = (), env: Mapping[str, str] | None = None,
                      ) -> TestRun:
    """Run test files (relative to ``root``) with the stdlib runner inside ``sandbox``.

    ``discover`` adds every ``test_*.py`` / ``*_test.py`` file under those
    directories (found inside the sandbox, so the agent's own files count).
    """
    targets = list(targets)
    if discover:
        found = await _discover(sandbox, root, discover, env)
        targets += [t for t in found if t not in targets]
    spec = runner_spec(root, targets, select=select, timeout_per_test=timeout_per_test,
                       conftest=conftest)
    if not targets:
        return TestRun({}, timed_out=False)
    # -s: no user site-packages; -B: no bytecode written. A fixed hash seed makes
    # the order of sets, and so parametrized test ids built from sets, reproducible.
    run_env = {**(env or {}), "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    for key in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH"):
        run_env.pop(key, None)
    result = await sandbox.run([PYTHON, "-s", "-B", "-c", RUNNER_SOURCE],
                               stdin=json.dumps(spec), timeout_s=timeout_s, cwd=root,
                               env=run_env, max_output_bytes=8 << 20)
    return _finish(parse_runner_output(result.stdout, spec["nonce"]), result)


def _finish(run: TestRun, result: ExecResult) -> TestRun:
    return TestRun(run.outcomes, run.messages, run.collect_errors,
                   timed_out=run.timed_out or result.timed_out, exit_code=result.exit_code,
                   stderr=result.stderr[-4000:], duration_s=result.duration_s)


async def _discover(sandbox: Sandbox, root: str, dirs: Sequence[str],
                    env: Mapping[str, str] | None) -> list[str]:
    quoted = " ".join(shlex.quote(d) for d in dirs)
    cmd = (f"for d in {quoted}; do [ -d \"$d\" ] && find \"$d\" -type f "
           "\\( -name 'test_*.py' -o -name '*_test.py' \\) -not -path '*/.*'; done | sort")
    result = await sandbox.run(cmd, timeout_s=30, cwd=root, env=env)
    return [line[2:] if line.startswith("./") else line
            for line in result.stdout.splitlines() if line.strip()][:500]


# ----- pytest ----------------------------------------------------------------------------
_PYTEST_STATUS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error",
                  "SKIPPED": "skipped", "XFAIL": "xfailed", "XPASS": "xpassed"}
_PYTEST_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)")


def parse_pytest_log(log: str) -> TestRun:
    """Outcomes from ``pytest -rA`` output (its short test summary lines).

    Handles ``PASSED id``, ``FAILED id - message``, ``ERROR id``, ``XFAIL id``
    and the verbose form ``id PASSED``; ``SKIPPED [n] file:line: reason``
    lines carry no id and are ignored.
    """
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    verbose = re.compile(r"^(\S+::\S*)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
    for raw in log.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", raw).strip()
        m = _PYTEST_LINE.match(line)
        if m and "::" in m.group(2):
            tid = m.group(2)
            outcomes[tid] = _PYTEST_STATUS[m.group(1)]
            if " - " in line:
                messages[tid] = line.split(" - ", 1)[1]
            continue
        m = verbose.match(line)
        if m:
            outcomes.setdefault(m.group(1), _PYTEST_STATUS[m.group(2)])
    return TestRun(outcomes, messages, timed_out=False)


async def run_pytest(sandbox: Sandbox, root: str, tests: Sequence[str], *, test_cmd: str | None,
                     timeout_s: float = 600.0, env: Mapping[str, str] | None = None) -> TestRun:
    """Run tests with a pytest command inside ``sandbox`` and parse its ``-rA`` summary."""
    ids = " ".join(shlex.quote(t) for t in tests)
    template = test_cmd or f"{PYTHON} -m pytest -rA -p no:cacheprovider {{tests}}"
    cmd = template.replace("{tests}", ids)
    result = await sandbox.run(["bash", "-c", cmd], timeout_s=timeout_s, cwd=root, env=env,
                               max_output_bytes=8 << 20)
    run = parse_pytest_log(result.stdout + "\n" + result.stderr)
    return TestRun(run.outcomes, run.messages, timed_out=result.timed_out,
                   exit_code=result.exit_code, stderr=result.stderr[-4000:],
                   duration_s=result.duration_s)


# ----- scoring ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Grade:
    """The verdict on one submission."""

    reward: float
    resolved: bool
    """Every FAIL_TO_PASS test passes and every PASS_TO_PASS test still passes."""
    f2p_passed: int
    f2p_total: int
    p2p_passed: int
    p2p_total: int
    failing: tuple[str, ...]
    """FAIL_TO_PASS and PASS_TO_PASS ids that did not pass (at most 50)."""

    @property
    def f2p_fraction(self) -> float:
        """Fraction of FAIL_TO_PASS tests passing (1 when there are none)."""
        return self.f2p_passed / self.f2p_total if self.f2p_total else 1.0

    @property
    def p2p_fraction(self) -> float:
        """Fraction of PASS_TO_PASS tests passing (1 when there are none)."""
        return self.p2p_passed / self.p2p_total if self.p2p_total else 1.0

    def components(self) -> dict[str, float]:
        """Reward components for ``info``."""
        return {"resolved": float(self.resolved), "fail_to_pass": self.f2p_fraction,
                "pass_to_pass": self.p2p_fraction}


def score(outcomes: Mapping[str, str], fail_to_pass: Sequence[str],
          pass_to_pass: Sequence[str], *, partial_credit: bool = False) -> Grade:
    """Grade per-test outcomes against FAIL_TO_PASS / PASS_TO_PASS (see module docs)."""
    if not fail_to_pass:
        raise ValueError("a task needs at least one FAIL_TO_PASS test")

    def ok(tid: str) -> bool:
        return outcomes.get(tid) in PASSING

    f2p_ok = [t for t in fail_to_pass if ok(t)]
    p2p_ok = [t for t in pass_to_pass if ok(t)]
    resolved = len(f2p_ok) == len(fail_to_pass) and len(p2p_ok) == len(pass_to_pass)
    grade = Grade(0.0, resolved, len(f2p_ok), len(fail_to_pass), len(p2p_ok),
                  len(pass_to_pass),
                  tuple(t for t in (*fail_to_pass, *pass_to_pass) if not ok(t))[:50])
    reward = 1.0 if resolved else (grade.f2p_fraction * grade.p2p_fraction
                                   if partial_credit else 0.0)
    return Grade(reward, *[getattr(grade, f) for f in
                           ("resolved", "f2p_passed", "f2p_total", "p2p_passed",
                            "p2p_total", "failing")])
