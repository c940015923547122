"""examples/new_env.py: the environment of docs/new_env.md (under 65 lines with its oracle)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sao_gym
from sao_gym.agents import ScriptedAgent
from sao_gym.types import StopReason
from sao_gym.utils.env_checker import check_agent_env
from tests.helpers import call, calls_msg

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "new_env.py"
ENV_ID = "examples/GuessNumber-v0"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("new_env_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers examples/GuessNumber-v0
    return module


def _guess(n: int) -> dict:
    return calls_msg(call("guess", {"n": n}))


def test_under_65_lines_and_documented():
    assert len(EXAMPLE.read_text().splitlines()) < 65
    doc = (ROOT / "docs" / "new_env.md").read_text()
    assert "examples/new_env.py" in doc and "check_agent_env" in doc


def test_the_checker_passes(example):
    assert ENV_ID in sao_gym.env_ids()
    passed = check_agent_env(sao_gym.make(ENV_ID))
    assert passed == ["spaces", "reset", "seed determinism", "gymnasium check_env",
                      "hostile actions", "ResetNeeded outside an episode", "close twice"]


async def test_scripted_episode_gets_the_expected_reward(example):
    agent = ScriptedAgent([_guess(50), _guess(25), _guess(37)])
    rollout = await sao_gym.run_episode(sao_gym.make(ENV_ID), agent, options={"secret": 37})
    assert (rollout.reward, rollout.terminated, rollout.stop_reason) == (
        1.0, True, StopReason.TERMINATED)
    assert rollout.metrics["turns"] == 3.0 and rollout.task_id.startswith("guess-")
    assert [m["content"] for m in rollout.messages if m["role"] == "tool"] == [
        "lower", "higher", "correct"]


async def test_bisection_always_wins_and_wrong_guesses_truncate(example):
    def bisect(messages):
        low, high = 1, 100
        for sent, reply in zip(messages[1::2], messages[2::2], strict=False):
            n = json.loads(sent["tool_calls"][0]["function"]["arguments"])["n"]
            low, high = (n + 1, high) if reply["content"] == "higher" else (low, n - 1)
        return _guess((low + high) // 2)

    for seed in range(20):
        rollout = await sao_gym.run_episode(sao_gym.make(ENV_ID), ScriptedAgent(bisect), seed=seed)
        assert rollout.reward == 1.0 and rollout.metrics["turns"] <= 7, seed
    stubborn = ScriptedAgent(lambda messages: _guess(0))
    rollout = await sao_gym.run_episode(sao_gym.make(ENV_ID), stubborn, options={"secret": 5})
    assert (rollout.reward, rollout.truncated, rollout.stop_reason) == (
        0.0, True, StopReason.MAX_TURNS)


def test_bad_input(example):
    with pytest.raises(ValueError, match="high"):
        example.GuessNumberEnv(high=1)


def test_the_script_runs(tmp_path):
    out = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == "reward 1.0 after 3 turns"
    assert "hostile actions" in out.stdout


def test_the_oracle_finds_every_secret_within_the_turn_limit(example):
    import tempfile

    from transformers import AutoTokenizer

    from sao_gym.models import COMPACT_TOOLS_TEMPLATE, tiny_model
    from sao_gym.registration import env_oracle
    from sao_gym.runtime.prepare.demonstrations import collect_demonstrations

    assert env_oracle(ENV_ID) is example.oracle
    with tempfile.TemporaryDirectory() as tmp:
        tok = AutoTokenizer.from_pretrained(tiny_model(tmp, hidden_size=64, num_layers=1,
                                                       chat_template=COMPACT_TOOLS_TEMPLATE))
    for high, turns in ((8, 4), (100, 7)):
        demos = collect_demonstrations(lambda h=high: sao_gym.make(ENV_ID, high=h), tok,
                                       example.oracle, episodes=40, max_new_tokens=16)
        assert all(d.reward == 1.0 for d in demos)
        assert max(d.metrics["turns"] for d in demos) == turns  # ceil(log2(high + 1))
