import subprocess
import sys

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
