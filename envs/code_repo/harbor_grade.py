"""The grader of an exported CodeRepo task, run in the task's container (``tests/grade.py``).

Usage: ``python3 -I /tests/grade.py /tests/grading.json /app``. Standard
library only: it imports sao-gym's own grading code from the copy next to it
(``tests/vendor/sao_gym/...``: ``grading.py``, ``testrunner.py`` and the
sandbox interface, verbatim), so a Harbor run grades exactly as
``sao_gym/CodeRepo-v0``'s ``submit`` does:

1. remove the test directories of the repository and write the hidden test
   files (``tests/hidden/``) fresh, whatever the agent did to its copies;
2. run the grading targets with the stdlib test runner (``python3 -s -B -c``,
   ``PYTHONHASHSEED=0``, a per-test time limit, an overall time limit);
3. reward 1 when every ``FAIL_TO_PASS`` test passes and every ``PASS_TO_PASS``
   test still passes, else 0 (with ``partial_credit``: the product of the two
   pass fractions), written to ``/logs/verifier/reward.txt``; the per-test
   outcomes go to ``/logs/verifier/grading.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VERIFIER_DIR = Path("/logs/verifier")


def _remove(path: Path) -> None:
    """Remove a file, a symlink or a directory tree (the agent may have made it unwritable)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        for sub, dirs, _ in os.walk(path):
            for d in dirs:
                p = os.path.join(sub, d)
                if not os.path.islink(p):
                    os.chmod(p, 0o755)
        os.chmod(path, 0o755)
        shutil.rmtree(path)


def restore_hidden_tests(spec: dict, root: Path, hidden: Path) -> None:
    """Clear the test directories under ``root`` and copy the hidden test files in."""
    for d in spec["clear_dirs"]:
        try:
            _remove(root / d)
        except OSError as e:
            print(f"could not clear {d}: {e}")
    for rel in spec["hidden_tests"]:
        target = root / rel
        for parent in reversed(target.relative_to(root).parents[:-1]):
            if (root / parent).is_symlink() or (root / parent).is_file():
                (root / parent).unlink()  # a planted link or file where a directory belongs
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            _remove(target)
        shutil.copyfile(hidden / rel, target)


def run_tests(spec: dict, root: Path, vendor: Path) -> tuple[dict, dict, bool, str]:
    """Run the grading targets with the stdlib runner: (outcomes, messages, timed_out, stderr)."""
    sys.path.insert(0, str(vendor))
    from sao_gym.envs.code_repo import grading

    runner = grading.runner_spec(str(root), spec["targets"],
                                 timeout_per_test=spec["timeout_per_test_s"],
                                 conftest=spec["conftests"])
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH")}
    env.update(spec.get("env", {}), PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
    try:
        proc = subprocess.run([grading.PYTHON, "-s", "-B", "-c", grading.RUNNER_SOURCE],
                              input=json.dumps(runner), capture_output=True, text=True,
                              errors="replace", cwd=root, env=env, timeout=spec["timeout_s"])
        stdout, stderr, timed_out = proc.stdout, proc.stderr, False
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (
            e.stdout or "")
        stderr, timed_out = "the test run hit its time limit", True
    run = grading.parse_runner_output(stdout, runner["nonce"])
    return run.outcomes, run.messages, timed_out or run.timed_out, stderr


def main(argv: list[str]) -> int:
    """Grade ``argv[1]``'s task in the repository ``argv[2]``; write the reward."""
    spec_path, root = Path(argv[1]), Path(argv[2])
    here = spec_path.parent
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    VERIFIER_DIR.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    restore_hidden_tests(spec, root, here / "hidden")
    outcomes, messages, timed_out, stderr = run_tests(spec, root, here / "vendor")
    from sao_gym.envs.code_repo import grading

    grade = grading.score(outcomes, spec["fail_to_pass"], spec["pass_to_pass"],
                          partial_credit=spec.get("partial_credit", False))
    (VERIFIER_DIR / "grading.json").write_text(json.dumps({
        "task_id": spec["task_id"], "reward": grade.reward, **grade.components(),
        "failing_tests": list(grade.failing), "timed_out": timed_out,
        "outcomes": outcomes, "seconds": round(time.monotonic() - t0, 3)}, indent=1))
    (VERIFIER_DIR / "reward.txt").write_text(f"{grade.reward:g}\n")
    for tid in list(grade.failing)[:10]:
        print(f"{outcomes.get(tid, 'missing')}: {tid}\n    "
              + messages.get(tid, "").strip()[-500:].replace("\n", "\n    "))
    if not outcomes and stderr.strip():
        print("runner stderr:\n" + stderr[-2000:])
    if timed_out:
        print("The test run hit its time limit; unreported tests count as failed.")
    print(f"FAIL_TO_PASS: {grade.f2p_passed}/{grade.f2p_total} passing, "  # last: in view
          f"PASS_TO_PASS: {grade.p2p_passed}/{grade.p2p_total} passing: "
          + ("resolved" if grade.resolved else "not resolved") + f"; reward {grade.reward:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
