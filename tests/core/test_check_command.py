"""``sao-gym check``: distinct random episodes, one traceback per distinct error, warnings."""

from __future__ import annotations

import json
import logging

import pytest

import sao_gym
import sao_gym.utils.env_checker as env_checker
from sao_gym.cli import main
from sao_gym.tools import ToolEnv, tool


class Recorder(ToolEnv):
    """Records every episode's task id and actions (class-wide: the CLI makes the envs)."""

    episodes: list[tuple[str, list[str]]] = []

    async def on_reset(self, options):
        self.task = {"id": f"rec-{int(self.np_random.integers(10**9))}", "prompt": "poke"}
        self.actions: list[str] = []
        Recorder.episodes.append((self.task["id"], self.actions))
        return [{"role": "user", "content": "Poke it."}], {}

    async def on_step(self, action):
        self.actions.append(json.dumps(action, sort_keys=True))
        return await super().on_step(action)

    @tool(description="Poke.", parameters={
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    def poke(self, n):
        return "poked"


class Crashing(Recorder):
    """Every step crashes, with one of two errors (by the task's parity)."""

    async def on_step(self, action):
        raise RuntimeError(f"sandbox {int(self.task['id'][4:]) % 2} is gone")


class StringReset(Recorder):
    async def on_reset(self, options):
        return "Poke it."


class Leaky(Recorder):
    async def on_reset(self, options):
        secret = int(self.np_random.integers(10, 100))
        self.task = {"id": f"guess-{secret}", "prompt": "Guess.", "answer": secret}
        self.actions = []
        return [{"role": "user", "content": "Guess a number."}], {}


@pytest.fixture(autouse=True)
def check_envs():
    """The envs of this module, registered only while its tests run (the registry-wide
    checks in test_env_checker.py must never see them: two of them fail on purpose)."""
    ids = [f"tests/Check{cls.__name__}-v0" for cls in (Recorder, Crashing, StringReset, Leaky)]
    for env_id, cls in zip(ids, (Recorder, Crashing, StringReset, Leaky), strict=True):
        sao_gym.register(env_id, cls, max_episode_steps=4)
    yield
    for env_id in ids:
        sao_gym.registration.unregister(env_id)


@pytest.fixture
def episodes_only(monkeypatch):
    """Skip the conformance checks: only the random episodes run."""
    monkeypatch.setattr(env_checker, "check_agent_env", lambda env: [])
    Recorder.episodes.clear()
    yield Recorder.episodes
    Recorder.episodes.clear()


def test_each_random_episode_has_its_own_seed(episodes_only, capsys):
    assert main(["check", "tests/CheckRecorder-v0", "--episodes", "6"]) == 0
    assert "ok   6 random episodes" in capsys.readouterr().out
    assert len(episodes_only) == 6
    assert len({task_id for task_id, _ in episodes_only}) == 6
    assert len({tuple(actions) for _, actions in episodes_only}) == 6


def test_the_same_crash_is_shown_once_and_counted(episodes_only, caplog, capsys):
    with caplog.at_level(logging.ERROR):
        assert main(["check", "tests/CheckCrashing-v0", "--episodes", "10"]) == 1
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert sorted(str(r.exc_info[1]) for r in tracebacks) == [
        "sandbox 0 is gone", "sandbox 1 is gone"]
    err = capsys.readouterr().err
    counts = [line for line in err.splitlines() if line.startswith("(same error")]
    assert len(counts) == 2 and all("RuntimeError: sandbox" in line for line in counts)
    more = sum(int(line.split()[2]) for line in counts)
    assert more == 8, counts
    assert "10/10 random episodes crashed" in err


def test_an_on_reset_that_returns_a_string_is_one_clear_failure(capsys):
    assert main(["check", "tests/CheckStringReset-v0", "--episodes", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("on_reset must return (messages, info)") == 1
    assert "StringReset.on_reset" in err and "got str" in err
    assert "too many values to unpack" not in err


def test_an_answer_in_the_task_id_is_a_warning_line(capsys):
    assert main(["check", "tests/CheckLeaky-v0", "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    warn = [line for line in out.splitlines() if line.startswith("warn")]
    assert len(warn) == 1 and "task['answer']" in warn[0] and "guess-" in warn[0]
    assert "PASS: tests/CheckLeaky-v0" in out
