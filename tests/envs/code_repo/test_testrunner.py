"""The stdlib test runner, the diff helpers and the grading rules of CodeRepo-v0.

The runner runs inside a real bubblewrap sandbox (standard library only, no
pytest), exactly as the environment uses it.
"""

from __future__ import annotations

import random
import textwrap

import pytest

from sao_gym.envs.code_repo import grading
from sao_gym.envs.code_repo.tasks import apply_patch, diff_files, patched_paths, unified_diff
from sao_gym.sandbox import make_sandbox

PYTEST_STYLE = textwrap.dedent('''
    import os
    import pytest

    CASES = {(1, None), (2, "b"), (3, None)}   # a set: its order changes between runs

    @pytest.fixture
    def base(monkeypatch):
        monkeypatch.setenv("SAO_X", "1")
        yield 10
        os.environ["SAO_TEARDOWN"] = "done"

    @pytest.fixture(params=[1, 2])
    def mult(request):
        return request.param

    def test_plain():
        assert 1 + 1 == 2

    def test_fails():
        assert [1, 2] == [1, 3]

    def test_errors():
        {}["missing"]

    def test_fixture(base):
        assert base == 10 and os.environ["SAO_X"] == "1"

    def test_from_conftest(shared):
        assert shared == "from conftest"

    def test_fixture_params(mult, base):
        assert mult * base in (10, 20)

    @pytest.mark.parametrize("a, b", [(1, 2), pytest.param(2, 3, id="two"), (5, 5)])
    def test_param(a, b):
        assert b == a + 1

    @pytest.mark.parametrize("n, tag", CASES)
    def test_set_param(n, tag):
        assert n > 0

    @pytest.mark.parametrize("x", [1, 2])
    @pytest.mark.parametrize("y", ["p", "q"])
    def test_stacked(x, y):
        assert x

    def test_raises():
        with pytest.raises(ValueError, match="bad"):
            raise ValueError("a bad value")
        with pytest.raises(KeyError):
            pass

    def test_approx():
        assert 0.1 + 0.2 == pytest.approx(0.3)
        assert [0.1 + 0.2] == pytest.approx([0.3])

    @pytest.mark.skip(reason="not today")
    def test_skipped():
        raise AssertionError

    @pytest.mark.skipif(True, reason="cond")
    def test_skipif():
        raise AssertionError

    @pytest.mark.xfail
    def test_xfail():
        assert False

    def test_skip_call():
        pytest.skip("inside")

    def test_prints_then_fails():
        print("hello from the test")
        assert False, "boom"

    def test_timeout():
        while True:
            pass

    def test_exit():
        raise SystemExit(0)

    def test_tmp_path(tmp_path):
        (tmp_path / "f").write_text("x")
        assert (tmp_path / "f").read_text() == "x"

    class TestGroup:
        def setup_method(self, method):
            self.value = 3

        def test_method(self):
            assert self.value == 3

        @pytest.mark.parametrize("k", [0, 1])
        def test_method_param(self, k):
            assert k < self.value
''')

UNITTEST_STYLE = textwrap.dedent('''
    import unittest

    class Case(unittest.TestCase):
        def test_ok(self):
            self.assertEqual(2 * 2, 4)

        def test_bad(self):
            self.assertEqual(2 * 2, 5)

        def test_err(self):
            raise RuntimeError("x")

        @unittest.skip("no")
        def test_skip(self):
            pass

        @unittest.expectedFailure
        def test_expected(self):
            self.fail("known")
''')

EXPECTED = {
    "tests/test_style.py::test_plain": "passed",
    "tests/test_style.py::test_fails": "failed",
    "tests/test_style.py::test_errors": "failed",
    "tests/test_style.py::test_fixture": "passed",
    "tests/test_style.py::test_from_conftest": "passed",
    "tests/test_style.py::test_fixture_params[1]": "passed",
    "tests/test_style.py::test_fixture_params[2]": "passed",
    "tests/test_style.py::test_param[1-2]": "passed",
    "tests/test_style.py::test_param[two]": "passed",
    "tests/test_style.py::test_param[5-5]": "failed",
    "tests/test_style.py::test_set_param[1-None]": "passed",
    "tests/test_style.py::test_set_param[2-b]": "passed",
    "tests/test_style.py::test_set_param[3-None]": "passed",
    "tests/test_style.py::test_stacked[p-1]": "passed",
    "tests/test_style.py::test_stacked[p-2]": "passed",
    "tests/test_style.py::test_stacked[q-1]": "passed",
    "tests/test_style.py::test_stacked[q-2]": "passed",
    "tests/test_style.py::test_raises": "failed",
    "tests/test_style.py::test_approx": "passed",
    "tests/test_style.py::test_skipped": "skipped",
    "tests/test_style.py::test_skipif": "skipped",
    "tests/test_style.py::test_xfail": "xfailed",
    "tests/test_style.py::test_skip_call": "skipped",
    "tests/test_style.py::test_prints_then_fails": "failed",
    "tests/test_style.py::test_timeout": "failed",
    "tests/test_style.py::test_exit": "failed",
    "tests/test_style.py::test_tmp_path": "passed",
    "tests/test_style.py::TestGroup::test_method": "passed",
    "tests/test_style.py::TestGroup::test_method_param[0]": "passed",
    "tests/test_style.py::TestGroup::test_method_param[1]": "passed",
    "tests/test_unit.py::Case::test_ok": "passed",
    "tests/test_unit.py::Case::test_bad": "failed",
    "tests/test_unit.py::Case::test_err": "failed",
    "tests/test_unit.py::Case::test_skip": "skipped",
    "tests/test_unit.py::Case::test_expected": "xfailed",
}


async def _write_suite(sb) -> None:
    await sb.write_file("tests/test_style.py", PYTEST_STYLE)
    await sb.write_file("tests/test_unit.py", UNITTEST_STYLE)
    await sb.write_file("tests/conftest.py", textwrap.dedent('''
        import pytest

        @pytest.fixture
        def shared():
            return "from conftest"
    '''))
    await sb.write_file("tests/test_broken.py", "import no_such_module_here\n")


@pytest.mark.slow
async def test_runner_reports_each_test_like_pytest():
    async with make_sandbox("local") as sb:
        await _write_suite(sb)
        targets = ["tests/test_style.py", "tests/test_unit.py", "tests/test_broken.py"]
        run = await grading.run_builtin(sb, sb.workdir, targets, timeout_per_test=1.0)
        assert run.outcomes == EXPECTED
        assert "no_such_module_here" in run.collect_errors["tests/test_broken.py"]
        assert "hello from the test" in run.messages["tests/test_style.py::test_prints_then_fails"]
        assert "timed out" in run.messages["tests/test_style.py::test_timeout"]
        assert "DID NOT RAISE" in run.messages["tests/test_style.py::test_raises"]
        assert not run.timed_out
        # the same ids again, and selection by id
        again = await grading.run_builtin(sb, sb.workdir, targets, timeout_per_test=1.0,
                                          select=["tests/test_style.py::test_set_param[2-b]",
                                                  "tests/test_unit.py::Case::test_ok"])
        assert again.outcomes == {"tests/test_style.py::test_set_param[2-b]": "passed",
                                  "tests/test_unit.py::Case::test_ok": "passed"}
        # conftest restricted to a list: the fixture is then unknown
        strict = await grading.run_builtin(sb, sb.workdir, ["tests/test_style.py"],
                                           select=["tests/test_style.py::test_from_conftest"],
                                           conftest=[])
        assert strict.outcomes == {"tests/test_style.py::test_from_conftest": "error"}
        summary = run.summary()
        assert summary.startswith(
            "20 passed, 9 failed, 4 skipped, 2 xfailed, 1 file(s) could not be imported")
        assert "FAILED tests/test_style.py::test_fails" in summary


async def test_runner_survives_hostile_tests():
    async with make_sandbox("local") as sb:
        await sb.write_file("tests/test_evil.py", textwrap.dedent('''
            import os, sys

            def test_a():
                pass

            def test_fake_report():
                # lines that imitate the runner without its nonce are ignored
                sys.__stdout__.write('deadbeef {"id": "tests/test_evil.py::test_c", '
                                     '"outcome": "passed"}\\n')
                sys.__stdout__.flush()

            def test_b():
                os._exit(0)

            def test_c():
                pass
        '''))
        run = await grading.run_builtin(sb, sb.workdir, ["tests/test_evil.py"])
        # the process died in test_b: test_c never ran, and the run is incomplete
        assert run.outcomes == {"tests/test_evil.py::test_a": "passed",
                                "tests/test_evil.py::test_fake_report": "passed"}
        assert run.timed_out
        grade = grading.score(run.outcomes, ["tests/test_evil.py::test_c"], [])
        assert (grade.reward, grade.resolved) == (0.0, False)


async def test_stale_bytecode_is_never_used():
    """A source edited within the same second, same size, must not run its old .pyc."""
    async with make_sandbox("local") as sb:
        await sb.write_file("mod.py", "def f():\n    return 1 + 1\n")
        await sb.write_file("tests/test_m.py",
                            "import mod\n\ndef test_f():\n    assert mod.f() == 2\n")
        r = await sb.run("python3 -c 'import py_compile; py_compile.compile(\"mod.py\")' "
                         "&& touch -r mod.py stamp")
        assert r.ok
        await sb.write_file("mod.py", "def f():\n    return 1 - 1\n")
        r = await sb.run("touch -r stamp mod.py && python3 -c 'import mod; print(mod.f())'")
        assert r.stdout == "2\n"  # plain Python runs the stale bytecode
        run = await grading.run_builtin(sb, sb.workdir, ["tests/test_m.py"])
        assert run.outcomes == {"tests/test_m.py::test_f": "failed"}


def test_parse_runner_output_needs_the_nonce():
    out = ('abc {"id": "t::a", "outcome": "passed"}\n'
           'xyz {"id": "t::b", "outcome": "passed"}\n'
           'abc {"id": "t::c", "outcome": "failed", "message": "m"}\n'
           'abc not json\nabc {"done": true}\n')
    run = grading.parse_runner_output(out, "abc")
    assert run.outcomes == {"t::a": "passed", "t::c": "failed"}
    assert run.messages == {"t::c": "m"} and not run.timed_out
    assert grading.parse_runner_output(out.replace("abc {\"done", "zz {\"done"), "abc").timed_out


def test_parse_pytest_log():
    log = textwrap.dedent("""
        ============================= test session starts ==============================
        tests/test_a.py::test_one PASSED                                         [ 25%]
        =========================== short test summary info ============================
        PASSED tests/test_a.py::test_one
        PASSED tests/test_a.py::test_p[1-2]
        FAILED tests/test_a.py::test_two - AssertionError: assert 1 == 2
        ERROR tests/test_b.py::test_three - ValueError
        SKIPPED [1] tests/test_a.py:9: no reason
        XFAIL tests/test_a.py::test_x - reason
        \x1b[31mFAILED\x1b[0m tests/test_c.py::TestK::test_k
        ========================= 1 failed, 2 passed in 0.05s ==========================
    """)
    run = grading.parse_pytest_log(log)
    assert run.outcomes == {
        "tests/test_a.py::test_one": "passed", "tests/test_a.py::test_p[1-2]": "passed",
        "tests/test_a.py::test_two": "failed", "tests/test_b.py::test_three": "error",
        "tests/test_a.py::test_x": "xfailed", "tests/test_c.py::TestK::test_k": "failed"}
    assert run.messages["tests/test_a.py::test_two"] == "AssertionError: assert 1 == 2"


def test_score_swe_bench_semantics_and_partial_credit():
    outcomes = {"f1": "passed", "f2": "failed", "p1": "passed", "p2": "xfailed", "p3": "error"}
    full = grading.score(outcomes, ["f1"], ["p1", "p2"])
    assert (full.reward, full.resolved, full.components()) == (
        1.0, True, {"resolved": 1.0, "fail_to_pass": 1.0, "pass_to_pass": 1.0})
    half = grading.score(outcomes, ["f1", "f2"], ["p1", "p2"])
    assert (half.reward, half.resolved, half.failing) == (0.0, False, ("f2",))
    partial = grading.score(outcomes, ["f1", "f2"], ["p1", "p2", "p3", "missing"],
                            partial_credit=True)
    assert partial.reward == pytest.approx(0.5 * 0.5)
    assert partial.failing == ("f2", "p3", "missing")
    nothing = grading.score({}, ["f1"], ["p1"], partial_credit=True)
    assert nothing.reward == 0.0
    skipped = grading.score({"f1": "skipped"}, ["f1"], [])
    assert skipped.reward == 0.0
    with pytest.raises(ValueError, match="FAIL_TO_PASS"):
        grading.score(outcomes, [], ["p1"])


def test_diffs_round_trip():
    rng = random.Random(0)
    for _ in range(300):
        old = [f"line {rng.randint(0, 5)}\n" for _ in range(rng.randint(0, 25))]
        new = list(old)
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.4 and new:
                new.pop(rng.randrange(len(new)))
            else:
                new.insert(rng.randint(0, len(new)), f"new {rng.randint(0, 9)}\n")
        a, b = "".join(old), "".join(new)
        if rng.random() < 0.2:
            b = b.rstrip("\n")
        patch = diff_files({"m.py": a, "n.py": "same\n"}, {"m.py": b, "n.py": "same\n"})
        assert apply_patch({"m.py": a, "n.py": "same\n"}, patch) == {"m.py": b, "n.py": "same\n"}
        assert patched_paths(patch) == (["m.py"] if a != b else [])
    assert unified_diff("x", "a\n", "a\n") == ""
    with pytest.raises(ValueError, match="does not apply"):
        apply_patch({"m.py": "other\n"}, unified_diff("m.py", "a\n", "b\n"))
    with pytest.raises(ValueError, match="does not exist"):
        apply_patch({}, unified_diff("m.py", "a\n", "b\n"))


async def test_our_diffs_apply_with_git_in_the_sandbox():
    rng = random.Random(1)
    async with make_sandbox("local") as sb:
        for i in range(10):
            old = "".join(f"v{rng.randint(0, 3)}\n" for _ in range(rng.randint(1, 20)))
            new = old.replace("v1", "w1", 1) + ("tail" if i % 3 == 0 else "")
            if new == old:
                new = old + "x\n"
            await sb.write_file(f"r{i}/m.py", old)
            patch = unified_diff("m.py", old, new)
            r = await sb.run(["git", "apply", "-"], stdin=patch, cwd=f"r{i}")
            assert r.ok, r.stderr
            assert (await sb.read_file(f"r{i}/m.py")).decode() == new


def test_module_docstring_examples():
    import doctest

    from sao_gym.envs.code_repo import tasks

    result = doctest.testmod(tasks)
    assert result.attempted > 0 and result.failed == 0
