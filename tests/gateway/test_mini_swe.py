"""mini-swe-agent (examples/harnesses/mini_swe.py) on CodeRepo HumanEval tasks through the gateway.

Its agent loop, prompts and litellm model run unmodified against the gateway;
its commands run in the task's sandbox through CodeRepo's ``bash`` tool, and its
``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` submits for CodeRepo's grade.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from sao_gym.gateway.harness import Harness
from sao_gym.gateway.rollouts import HarnessRollouts
from sao_gym.gateway.tasks import TaskSource
from sao_gym.inference.scripted import ScriptedBackend
from sao_gym.models import IM_END

pytest.importorskip("minisweagent")

HARNESS = "examples.harnesses.mini_swe:run"
TASKS = TaskSource(env="sao_gym/CodeRepo-v0", env_kwargs={"tasks": "humaneval"})


async def test_its_commands_run_in_the_sandbox_and_its_submission_is_graded(tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    end = tok.convert_tokens_to_ids(IM_END)

    def answer(prompt, params):  # list the repository, then submit
        text = tok.decode(prompt)
        command = ("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" if "returncode" in text
                   else "ls -1 && echo listed")
        return tok.encode(f'bash("{command}")', add_special_tokens=False) + [end]

    runs = HarnessRollouts(Harness(HARNESS, timeout_s=120), TASKS, ScriptedBackend(answer), tok,
                           max_new_tokens=64, max_context_tokens=8192)
    try:
        ro = await runs.play(0, sample_seed=1)
    finally:
        await runs.aclose()
    assert not ro.infra_failure and ro.stop_reason.value == "terminated"
    assert ro.metrics["turns"] == 2 and ro.metrics["segments"] == 1
    observation = next(m["content"] for m in ro.messages if m["role"] == "tool")
    assert "listed" in observation and '"returncode": 0' in observation
    assert ro.reward == 0.0  # the stub, unchanged, fails the hidden tests: graded, not assumed


@pytest.mark.slow
def test_a_five_step_run_trains_mini_swe_agent_on_humaneval(tmp_path):
    """5 learner steps of 4 episodes: 20 training episodes, then 4 evaluated, all complete."""
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sao_gym.cli", "train", "--set", "env=sao_gym/CodeRepo-v0",
         "--set", "env_kwargs={tasks: humaneval}", "--set", f"agent.program={HARNESS}",
         "--set", "warm_start=null", "--set", "total_steps=5", "--set", "rollout.batch_size=4",
         "--set", "rollout.concurrency=4", "--set", "eval.episodes=4",
         "--set", "checkpoint.every=0", "--set", "rollout.max_new_tokens=24",
         "--set", "rollout.max_context_tokens=4096",
         "--set", "model_options={hidden_size: 64, num_layers: 1}", "--out", str(run)],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 5 and all(s["learner/action_tokens"] > 0 for s in steps)
    assert sum(s.get("rollouts/infra_failures", 0) for s in steps) == 0
    after = json.loads((run / "eval_after.json").read_text())
    assert after["episodes"] == 4 and after["infra_failures"] == 0
