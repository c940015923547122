import subprocess
import sys

import pytest

import sao_gym
from sao_gym.cli import main
from tests.core.test_env_checker import FragileEnv

sao_gym.register("tests/Fragile-v0", FragileEnv, max_episode_steps=3)


def test_envs_lists_builtin_ids(capsys):
    assert main(["envs"]) == 0
    assert "sao_gym/Arithmetic-v0" in capsys.readouterr().out.split()


def test_check_passes_for_arithmetic(capsys):
    assert main(["check", "sao_gym/Arithmetic-v0", "--episodes", "5"]) == 0
    out = capsys.readouterr().out
    assert "PASS: sao_gym/Arithmetic-v0" in out and "ok   hostile actions" in out


def test_check_fails_with_a_readable_report(capsys):
    assert main(["check", "tests/Fragile-v0", "--episodes", "0"]) == 1
    err = capsys.readouterr().err
    assert "FAIL: tests/Fragile-v0" in err and "hostile actions" in err
    assert main(["check", "sao_gym/Missing-v0"]) == 2


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "sao_gym.cli", "envs"], capture_output=True,
                         text=True, check=True)
    assert "sao_gym/Arithmetic-v0" in out.stdout


def test_train_result_prints_gain_with_intervals():
    from sao_gym.cli.train import gain_lines

    # hand values: Wilson 128/256 -> 0.5 +- 0.0608; 192/256 -> 0.7463 +- 0.0528;
    # gain 0.25 +- 1.96 * sqrt(0.25/256 + 0.1875/256) = 0.25 +- 0.0810
    lines = gain_lines({"success_rate": 0.5, "episodes": 256, "infra_failures": 0},
                        {"success_rate": 0.75, "episodes": 258, "infra_failures": 2})
    assert lines[0] == ("success:    0.500 [0.439, 0.561] before -> 0.750 [0.694, 0.799] "
                        "after RL (256 held-out episodes, 95% intervals)")
    assert lines[1] == "gain:       +25.0 points (95% interval +16.9 to +33.1)"


def test_an_interrupted_result_prints_its_step_and_no_gain(capsys):
    from sao_gym.cli.train import print_result

    summary = {"success_rate": 0.5, "episodes": 256, "infra_failures": 0}
    print_result({"run_dir": "runs/x", "checkpoint": "runs/x/checkpoints/step_0000007",
                   "interrupted": True, "steps_done": 7, "total_steps": 200,
                   "eval_before": summary, "eval_after": summary, "plots": []})
    out = capsys.readouterr().out
    assert "interrupted at step 7 of 200" in out and "--resume runs/x" in out
    assert "after RL" not in out and "gain" not in out
    print_result({"run_dir": "runs/x", "checkpoint": None, "interrupted": False,
                   "eval_before": summary, "eval_after": summary})
    out = capsys.readouterr().out
    assert "interrupted" not in out and "after RL" in out and "gain:" in out


def hide_modules(monkeypatch, *tops):
    """Make ``import top`` (and its submodules) raise ModuleNotFoundError, as without the extra."""
    for name in list(sys.modules):
        if name in tops or name.startswith(tuple(t + "." for t in tops)):
            monkeypatch.setitem(sys.modules, name, None)
    for top in tops:
        monkeypatch.setitem(sys.modules, top, None)


def test_a_missing_extra_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "sao_gym.plotting", raising=False)
    hide_modules(monkeypatch, "matplotlib")
    assert main(["plot", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("error: sao-gym plot needs the module 'matplotlib'")
    assert "pip install 'sao-gym[train]'" in err


def test_a_missing_module_of_no_extra_is_not_hidden(monkeypatch):
    import sao_gym.cli.runs

    def broken(args):
        raise ModuleNotFoundError("No module named 'no_such_module'", name="no_such_module")

    monkeypatch.setattr(sao_gym.cli.runs, "cmd_plot", broken)
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        main(["plot", "somewhere"])


def test_an_env_adds_its_task_maker_to_the_tasks_command(capsys):
    """``sao-gym tasks`` holds what each env's 'tasks_cli' hook adds, plugins' too."""
    import sao_gym
    from sao_gym.registration import env_ids_with, unregister

    def add_parser(tasks_sub):
        p = tasks_sub.add_parser("make-counting", help="count to N")
        p.add_argument("--n", type=int, required=True)
        p.set_defaults(fn=lambda args: print(list(range(args.n))) or 0)

    sao_gym.register("cli_test/Counting-v0", "sao_gym.envs.arithmetic:ArithmeticEnv",
                     hooks={"tasks_cli": add_parser})
    try:
        assert "cli_test/Counting-v0" in env_ids_with("tasks_cli")
        assert "sao_gym/CodeRepo-v0" in env_ids_with("tasks_cli")
        assert "sao_gym/Arithmetic-v0" not in env_ids_with("tasks_cli")
        assert main(["tasks", "make-counting", "--n", "3"]) == 0
        assert capsys.readouterr().out == "[0, 1, 2]\n"
    finally:
        unregister("cli_test/Counting-v0")
    with pytest.raises(SystemExit):
        main(["tasks", "make-counting", "--n", "3"])
