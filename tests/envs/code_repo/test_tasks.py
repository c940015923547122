"""Oracle tests over every bundled CodeRepo-v0 task: HumanEval and the shipped bug tasks.

Reference solutions must score 1 and known-wrong ones 0, through the grading
path of the environment (hidden tests written fresh, the stdlib runner in a
real bubblewrap sandbox, per-test outcomes scored with SWE-bench semantics).
Many repositories are graded in one sandbox to keep this fast.
"""

from __future__ import annotations

import json
import random
import shlex
from collections import Counter

import pytest

from sao_gym.envs.code_repo import grading, humaneval, mutate
from sao_gym.envs.code_repo.env import GIT_ENV, prepare_hidden_tests
from sao_gym.envs.code_repo.tasks import (
    BUGS_DIR,
    RepoTask,
    apply_patch,
    read_jsonl,
    shipped_bug_tasks,
)
from sao_gym.sandbox import make_sandbox


async def _grade_batch(sb, jobs, timeout_per_test=10.0):
    """Grade many (task, files) repositories in one sandbox command; returns TestRuns.

    Each job gets its own directory; the hidden tests are put in place by the
    environment's own ``prepare_hidden_tests`` and run by the same runner the
    environment uses (one process per repository, as in the env).
    """
    specs = []
    for i, (task, files, extra_targets) in enumerate(jobs):
        root = f"{sb.workdir}/job{i}"
        for path, text in files.items():
            await sb.write_file(f"job{i}/{path}", text)
        if i < 2:
            await prepare_hidden_tests(sb, task, root)  # the env's own step, on a sample
        else:  # the same files (a fresh directory has no agent-made test files to remove)
            for path, text in task.hidden_tests.items():
                await sb.write_file(f"job{i}/{path}", text)
        spec = grading.runner_spec(root, [*task.grading_targets, *extra_targets],
                                   timeout_per_test=timeout_per_test, conftest=[])
        specs.append(spec)
        await sb.write_file(f"specs/{i}.json", json.dumps(spec))
    await sb.write_file("runner.py", grading.RUNNER_SOURCE)
    loop = (f"for i in $(seq 0 {len(jobs) - 1}); do python3 -s -B runner.py "
            "< specs/$i.json; done")
    env = {**GIT_ENV, "PYTHONHASHSEED": "0"}
    result = await sb.run(["bash", "-c", loop], timeout_s=600, env=env,
                          max_output_bytes=64 << 20)
    assert not result.timed_out, "the batch ran past 600 s"
    return [grading.parse_runner_output(result.stdout, spec["nonce"]) for spec in specs]


def _is_canonical(job) -> bool:
    task, files, _ = job
    return files["solution.py"] != task.files["solution.py"]


def _canonical(task: RepoTask) -> dict[str, str]:
    return apply_patch(task.files, task.reference_patch)


def test_humaneval_tasks_are_complete():
    tasks = humaneval.load_humaneval()
    assert len(tasks) == 164
    assert [t.id for t in tasks] == [f"humaneval/{i}" for i in range(164)]
    problems = humaneval.load_problems()
    for task, problem in zip(tasks, problems, strict=True):
        assert task.fail_to_pass == (humaneval.HIDDEN_ID,) and task.pass_to_pass == ()
        assert problem["entry_point"] in task.prompt
        assert humaneval.HIDDEN_TEST not in task.files  # hidden until grading
        solved = _canonical(task)["solution.py"]
        assert solved.rstrip("\n") == (problem["prompt"] + problem["canonical_solution"]).rstrip(
            "\n")
    with_examples = sum(humaneval.EXAMPLES_TEST in t.files for t in tasks)
    assert with_examples == 66


@pytest.mark.slow
async def test_all_humaneval_canonical_solutions_pass_and_stubs_fail():
    tasks = humaneval.load_humaneval()
    jobs = []
    for task in tasks:
        solved = _canonical(task)
        examples = [humaneval.EXAMPLES_TEST] if humaneval.EXAMPLES_TEST in task.files else []
        # the visible examples are removed with tests/ by prepare_hidden_tests: put them back
        # under another name so that the canonical solution is checked against them too
        if examples:
            solved["examples/test_examples.py"] = task.files[humaneval.EXAMPLES_TEST]
            examples = ["examples/test_examples.py"]
        jobs.append((task, solved, examples))
        if task.id.endswith(("0", "5")):  # the unsolved stubs, a sample
            jobs.append((task, dict(task.files), []))
    async with make_sandbox("local") as sb:
        runs = await _grade_batch(sb, jobs)
    results = [(task.id, grading.score(run.outcomes, task.fail_to_pass,
                                       task.pass_to_pass).reward, run.outcomes, examples)
               for (task, _, examples), run in zip(jobs, runs, strict=True)]
    canonical = [r for r, job in zip(results, jobs, strict=True) if _is_canonical(job)]
    stubs = [r for r, job in zip(results, jobs, strict=True) if not _is_canonical(job)]
    assert (len(canonical), len(stubs)) == (164, 33)
    assert [tid for tid, reward, _, _ in canonical if reward != 1.0] == []
    assert [tid for tid, reward, _, _ in stubs if reward != 0.0] == []
    checked = 0
    for tid, _, outcomes, examples in canonical:
        for path in examples:
            assert outcomes.get(f"{path}::test_docstring_examples") == "passed", tid
            checked += 1
    assert checked == 66


@pytest.mark.slow
async def test_mutated_humaneval_solutions_fail():
    """Mutants of canonical solutions (operator swaps, off-by-one, ...) are caught."""
    rng = random.Random(0)
    tasks = humaneval.load_humaneval()
    jobs = []
    for task in tasks[::6]:
        solved = _canonical(task)["solution.py"]
        stub_lines = task.files["solution.py"].count("\n")
        body = [m for m in mutate.find_mutations("solution.py", solved) if m.line > stub_lines]
        if body:
            mutant = rng.choice(body)
            jobs.append((task, {"solution.py": mutant.source}, []))
    assert len(jobs) >= 25
    async with make_sandbox("local") as sb:
        runs = await _grade_batch(sb, jobs, timeout_per_test=2.0)
    rewards = [grading.score(r.outcomes, t.fail_to_pass, t.pass_to_pass).reward
               for (t, _, _), r in zip(jobs, runs, strict=True)]
    caught = rewards.count(0.0)
    # some mutants are equivalent to the original program; the tests catch most of them
    assert caught >= 0.8 * len(jobs), f"only {caught} of {len(jobs)} mutants caught"


def test_shipped_bug_tasks_are_valid_records():
    tasks = shipped_bug_tasks()
    packages = Counter(t.metadata["package"] for t in tasks)
    assert len(tasks) >= 50 and len(packages) >= 3, packages
    assert all(n >= 8 for n in packages.values()), packages
    assert len({t.id for t in tasks}) == len(tasks)
    total = sum(p.stat().st_size for p in BUGS_DIR.glob("*.jsonl.gz"))
    assert total < 400_000, f"shipped bug data is {total} bytes"
    for path in sorted(BUGS_DIR.glob("*.jsonl.gz")):
        records = read_jsonl(path)
        pkg = records[0]
        assert pkg["kind"] == "package" and pkg["name"] == path.name.split(".")[0]
        assert any(p.upper().startswith("LICEN") for p in pkg["files"]), pkg["name"]
        baseline = set(pkg["baseline_pass"])
        assert len(baseline) >= 100
        for rec in records[1:]:
            assert set(rec["FAIL_TO_PASS"]) <= baseline
    for task in tasks:
        original = apply_patch(task.files, task.reference_patch)
        changed = [p for p in original if original[p] != task.files[p]]
        assert changed == [task.metadata["file"]], task.id  # one file, the mutated one
        assert set(task.fail_to_pass).isdisjoint(task.pass_to_pass)
        assert all(original[p] == text for p, text in task.hidden_tests.items())
        assert task.metadata["function"] in task.id
        assert len(task.fail_to_pass) >= 1


@pytest.mark.slow
async def test_every_bug_task_reference_scores_one_and_bug_scores_zero():
    """Per package: the original source passes the whole suite (every task's reference
    patch leads back to it), and each bug makes each of its FAIL_TO_PASS tests fail."""
    by_package: dict[str, list[RepoTask]] = {}
    for task in shipped_bug_tasks():
        by_package.setdefault(task.metadata["package"], []).append(task)
    for name, tasks in sorted(by_package.items()):
        original = apply_patch(tasks[0].files, tasks[0].reference_patch)
        async with make_sandbox("local") as sb:
            for path, text in original.items():
                await sb.write_file(path, text)
            run = await grading.run_builtin(sb, sb.workdir, tasks[0].grading_targets,
                                            timeout_s=300)
            for task in tasks:
                assert apply_patch(task.files, task.reference_patch) == original
                grade = grading.score(run.outcomes, task.fail_to_pass, task.pass_to_pass)
                assert grade.reward == 1.0, (task.id, grade.failing)
            # every bug in one sandbox command: swap the buggy module in, run its
            # FAIL_TO_PASS tests, put the original back
            await sb.write_file("runner.py", grading.RUNNER_SOURCE)
            lines, specs = [], []
            for i, task in enumerate(tasks):
                path = shlex.quote(task.metadata["file"])
                await sb.write_file(f"bugs/{i}", task.files[task.metadata["file"]])
                spec = grading.runner_spec(sb.workdir, task.grading_targets,
                                           select=task.fail_to_pass, timeout_per_test=5.0)
                specs.append(spec)
                await sb.write_file(f"specs/{i}.json", json.dumps(spec))
                lines.append(f"cp {path} orig; cp bugs/{i} {path}; "
                             f"python3 -s -B runner.py < specs/{i}.json; cp orig {path}")
            result = await sb.run(["bash", "-c", "\n".join(lines)], timeout_s=600,
                                  env={"PYTHONHASHSEED": "0"}, max_output_bytes=32 << 20)
            assert not result.timed_out
            for task, spec in zip(tasks, specs, strict=True):
                bug_run = grading.parse_runner_output(result.stdout, spec["nonce"])
                assert set(bug_run.outcomes) <= set(task.fail_to_pass), task.id
                missing = {t.split("::")[0] for t in task.fail_to_pass
                           if t not in bug_run.outcomes}
                assert missing <= set(bug_run.collect_errors), task.id  # import-time failures
                still_passing = [t for t, o in bug_run.outcomes.items() if o in grading.PASSING]
                assert still_passing == [], (task.id, still_passing)
                assert grading.score(bug_run.outcomes, task.fail_to_pass,
                                     task.pass_to_pass).reward == 0.0
            for path, text in original.items():
                assert (await sb.read_file(path)).decode() == text, f"{name}: {path} not restored"
