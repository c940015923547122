"""A user's own environment, trained end to end from the command line with no config.

The env lives in a module outside the package (written to a temporary folder):
`sao-gym train --set env=MOD:ID` picks the generic CPU recipe, keeps the env's
registered turn limit, fits the token budgets to the oracle's demonstrations,
warm-starts, trains and evaluates; `sao-gym eval --run` repeats the run's own
final evaluation; the same env shipped with an entry point trains without the
`MOD:` prefix; an env without an oracle says that RL starts from the raw model.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

pytestmark = pytest.mark.slow

ENV_MODULE = textwrap.dedent('''
    import sao_gym
    from sao_gym import ToolEnv, ToolResult, tool

    WORDS = ["lamp", "quill", "tulip", "anvil", "comet"]
    ARG = {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}


    class Relay(ToolEnv):
        """Read a card, follow it to a second card, report the word it names."""

        async def on_reset(self, options):
            rng = self.np_random
            first, second, word = (str(w) for w in rng.choice(WORDS, size=3, replace=False))
            self.cards = {"start": f"see {first}", first: f"see {second}", second: word}
            self.task = {"id": f"relay-{int(rng.integers(10**9))}", "answer": word}
            return [{"role": "user", "content": "Follow the cards from start."}], {}

        @tool(description="Read a card.", parameters=ARG)
        async def read(self, word: str):
            return self.cards.get(word.strip(), "no such card")

        @tool(description="List the cards.", parameters={"type": "object", "properties": {}})
        async def cards(self):
            return " ".join(sorted(self.cards))

        @tool(description="Report the word.", parameters=ARG)
        async def report(self, word: str):
            ok = word.strip() == self.task["answer"]
            return ToolResult("yes" if ok else "no", terminated=True, reward=float(ok))


    def oracle(messages, task):
        text = messages[-1].get("content") or ""
        if messages[-1].get("role") != "tool":
            return "read(start)"
        if text.startswith("see "):
            return f"read({text[4:]})"
        return f"report({text})"


    sao_gym.register("own/Relay-v0", Relay, max_episode_steps=6, oracle=oracle)
    sao_gym.register("own/NoOracle-v0", Relay, max_episode_steps=6)
''')

QUICK = ["--set", "total_steps=2", "--set", "rollout.batch_size=4",
         "--set", "rollout.concurrency=4", "--set", "warm_start.steps=4",
         "--set", "warm_start.episodes=16", "--set", "warm_start.holdout_episodes=4",
         "--set", "eval.episodes=6", "--set", "checkpoint.every=0",
         "--set", "model_options={hidden_size: 64, num_layers: 1}"]


@pytest.fixture
def own_env(tmp_path):
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "relay_env.py").write_text(ENV_MODULE)
    return folder


def _sao_gym(*args, pythonpath, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath),
                                                         os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "sao_gym.cli", *args], capture_output=True,
                          text=True, timeout=900, env=env, cwd=cwd)


def test_an_own_env_trains_from_the_cli_with_no_config_and_eval_repeats_its_numbers(
        own_env, tmp_path):
    run = tmp_path / "run"
    done = _sao_gym("train", "--set", "env=relay_env:own/Relay-v0", *QUICK, "--out", str(run),
                    pythonpath=own_env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stderr + done.stdout
    assert "demonstrations: the oracle registered with relay_env:own/Relay-v0" in said
    assert "rollout.max_new_tokens = " in said and "rollout.max_context_tokens = " in said
    assert "the held-out target was not reached in 4 steps; RL starts from this" in said
    config = yaml.safe_load((run / "config.yaml").read_text())
    rollout = config["rollout"]
    assert isinstance(rollout["max_new_tokens"], int) and rollout["max_new_tokens"] >= 8
    assert isinstance(rollout["max_context_tokens"], int)
    assert rollout["max_episode_steps"] is None  # the env's registered limit applies
    assert config["env_kwargs"] == {}
    after = json.loads((run / "eval_after.json").read_text())
    assert after["max_episode_steps"] == 6 and after["episodes"] == 6
    assert after["max_new_tokens"] == rollout["max_new_tokens"]
    # `sao-gym eval --run` evaluates as the run did: same episodes, same numbers
    again = _sao_gym("eval", "--run", str(run), pythonpath=own_env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads((run / "eval.json").read_text())
    for key in ("episodes", "success_rate", "turns_mean", "return_mean", "max_episode_steps",
                "max_new_tokens", "max_context_tokens", "temperature", "seed"):
        assert result[key] == after[key], key


def test_an_installed_env_trains_by_its_bare_id_and_one_without_oracle_says_so(
        own_env, tmp_path):
    info = own_env / "relay_env-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: relay-env\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[sao_gym.envs]\nrelay = relay_env\n")
    run = tmp_path / "run"
    done = _sao_gym("train", "--set", "env=own/Relay-v0", *QUICK, "--set", "eval.episodes=0",
                    "--out", str(run), pythonpath=own_env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "demonstrations: the oracle registered with own/Relay-v0" in done.stderr + done.stdout
    assert (run / "model" / "warm_start" / "config.json").is_file()
    bare = tmp_path / "bare"
    done = _sao_gym("train", "--set", "env=own/NoOracle-v0", *QUICK, "--set", "eval.episodes=0",
                    "--out", str(bare), pythonpath=own_env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join((done.stderr + done.stdout).split())
    assert "registers no oracle" in said and "starts from the raw model" in said
    assert "no demonstrations to fit to" in said
    assert not (bare / "model" / "warm_start").exists()
