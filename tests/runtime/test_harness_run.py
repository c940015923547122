"""A harness of the user's (the openai client in a loop) trained by `sao-gym train`.

The harness is examples/harnesses/openai_loop.py, unmodified, pointed at the
run's gateway: its episodes are rollouts under the staleness rule, trained with
the sampler's exact logprobs, evaluated through the same harness.
"""

import json
import subprocess
import sys

import pytest

from sao_gym.runtime.config.build import SetupError, check_harness, harness_factory
from sao_gym.runtime.config.loader import load_config
from sao_gym.runtime.config.schema import ConfigError

HARNESS = "examples.harnesses.openai_loop:run"
QUICK = ["--set", "env=sao_gym/KeyChain-v0", "--set", "env_kwargs.hops=2",
         "--set", f"agent.program={HARNESS}", "--set", "warm_start=null",
         "--set", "total_steps=2", "--set", "rollout.batch_size=2",
         "--set", "rollout.concurrency=2", "--set", "eval.episodes=2",
         "--set", "checkpoint.every=0", "--set", "rollout.max_new_tokens=24",
         "--set", "rollout.max_context_tokens=768",
         "--set", "model_options={hidden_size: 64, num_layers: 1}"]


@pytest.mark.slow
def test_sao_gym_train_trains_a_harness_through_the_gateway(tmp_path):
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "sao_gym.cli", "train", *QUICK,
                           "--set", "agent.workers=1",  # the harness in a worker process
                           "--out", str(run)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["learner/action_tokens"] > 0
        # the learner's logprobs of the sampled tokens are the sampler's (same weights at
        # version 0, temperature 1): the gateway recorded the tokens as sampled
        assert s["mismatch/approx_kl"] < 1e-4 and s["mismatch/masked_share"] == 0
    after = json.loads((run / "eval_after.json").read_text())
    assert after["episodes"] == 2 and after["infra_failures"] == 0
    record = json.loads(next((run / "rollouts" / "train").glob("0?????.jsonl")).read_text()
                        .splitlines()[0])
    assert record["env_id"] == "sao_gym/KeyChain-v0" and record["metrics"]["turns"] >= 1
    assert record["messages"][0]["role"] == "system"


def _config(tmp_path, *sets):
    return load_config(None, [*QUICK[1::2], *sets])


def test_harness_settings_are_checked_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match="agent.oracle are for a harness"):
        load_config(None, ["env=sao_gym/KeyChain-v0", "agent.tasks=t.jsonl"])
    with pytest.raises(ConfigError, match="set one"):
        load_config(None, ["agent.program=a:b", "agent.command=run-agent"])
    with pytest.raises(ConfigError, match="agent.oracle are for a harness"):
        load_config(None, ["env=sao_gym/KeyChain-v0", "agent.oracle=a:b"])
    with pytest.raises(ConfigError, match="a command harness is a process of its own"):
        load_config(None, ["agent.command=run-agent", "agent.workers=2"])
    with pytest.raises(ConfigError, match="agent.workers must be >= 0"):
        load_config(None, ["agent.program=a:b", "agent.workers=-1"])
    assert harness_factory(_config(tmp_path, "agent.workers=3")).workers == 3
    with pytest.raises(SetupError, match="agent.oracle 'no_such:oracle' cannot be imported"):
        check_harness(_config(tmp_path, "warm_start.steps=10", "agent.oracle=no_such:oracle"))
    with pytest.raises(SetupError, match="another prompt format"):
        check_harness(_config(tmp_path, "warm_start.steps=10",
                              "warm_start.demonstrations=demos.jsonl"))
    with pytest.raises(SetupError, match="cannot be imported"):
        check_harness(_config(tmp_path, "agent.program=no_such_module:run"))
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(SetupError, match="missing.jsonl"):
        check_harness(_config(tmp_path, f"agent.tasks={missing}"))
    made = harness_factory(_config(tmp_path, "agent.program=null",
                                   "agent.command=my-agent --fast 'two words'"))
    assert made.harness.command == ("my-agent", "--fast", "two words")
    assert made.tasks.env == "sao_gym/KeyChain-v0" and made.tasks.env_kwargs == {"hops": 2}
    check_harness(_config(tmp_path))  # the example imports, its tasks are the env's seeds


def test_a_harness_runs_warm_start_is_an_oracle_answering_it_through_the_gateway(tmp_path):
    from sao_gym.registration import env_oracle
    from sao_gym.runtime.config.build import demonstration_plan, prepare_plan

    plan = demonstration_plan(_config(tmp_path, "warm_start.steps=10"))
    assert plan.harness.harness.program == HARNESS and plan.oracle is env_oracle(
        "sao_gym/KeyChain-v0")
    assert plan.what == ("the oracle registered with sao_gym/KeyChain-v0, answering "
                         f"{HARNESS} through the gateway")
    mine = demonstration_plan(_config(tmp_path, "warm_start.steps=10",
                                      "agent.oracle=tests.gateway.harnesses:final_has_value"))
    assert mine.oracle.__name__ == "final_has_value"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a"}\n')
    from_file = _config(tmp_path, "warm_start.steps=10", f"agent.tasks={tasks}")
    assert demonstration_plan(from_file) is None
    assert "agent.oracle names no oracle" in prepare_plan(from_file).no_warm_start
