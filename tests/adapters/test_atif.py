"""Kept rollouts as ATIF trajectories: token-exact steps, the CLI, and Harbor's own model."""

import json
import subprocess

import pytest

from sao_gym.adapters.atif import ATIF_VERSION, trajectory
from sao_gym.cli import main
from sao_gym.rollout_store import RolloutReader, RolloutWriter, rollout_record
from sao_gym.types import Rollout, StopReason
from tests.viewer.helpers import hostile_run


def _two_turn_record(traced=True):
    """prompt (3) | call (2) | tool result (2) | answer (3) | nothing after."""
    ids = [1, 2, 3, 10, 11, 20, 21, 30, 31, 32]
    mask = [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    lps = [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0, -2.0, -3.0]
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "what is 2+2?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c0", "type": "function",
                     "function": {"name": "calc", "arguments": '{"expr": "2+2"}'}}]},
                {"role": "tool", "tool_call_id": "c0", "name": "calc", "content": "4"},
                {"role": "assistant", "content": "4"}]
    r = Rollout(token_ids=ids, loss_mask=mask, rollout_logprobs=lps,
                policy_versions=[-1, -1, -1, 3, 3, -1, -1, 4, 4, 4], reward=1.0,
                terminated=True, truncated=False, stop_reason=StopReason.TERMINATED,
                infra_failure=False, messages=messages, env_id="e/E-v0", task_id="2+2",
                seed=5, metrics={"turns": 2.0})
    learner = {"advantage": [0.1 * i for i in range(10)], "dis_mask": mask} if traced else None
    return {"id": 7, **rollout_record(r, split="train", step=4, learner=learner,
                                      learner_step=4)}


def test_a_record_becomes_token_exact_atif_steps():
    rec = _two_turn_record()
    doc = trajectory(rec, model_name="tiny")
    assert doc["schema_version"] == ATIF_VERSION and doc["trajectory_id"] == "train-7"
    assert [s["source"] for s in doc["steps"]] == ["system", "user", "agent", "agent"]
    assert [s["step_id"] for s in doc["steps"]] == [1, 2, 3, 4]
    call, answer = doc["steps"][2], doc["steps"][3]
    assert call["tool_calls"] == [{"tool_call_id": "c0", "function_name": "calc",
                                   "arguments": {"expr": "2+2"}}]
    assert call["observation"] == {"results": [{"content": "4", "source_call_id": "c0",
                                                "extra": {"name": "calc"}}]}
    assert call["metrics"] == {"prompt_tokens": 3, "completion_tokens": 2,
                               "completion_token_ids": [10, 11], "logprobs": [-0.5, -0.25],
                               "prompt_token_ids": [1, 2, 3]}
    assert answer["metrics"]["prompt_tokens"] == 7 and "prompt_token_ids" not in answer["metrics"]
    assert call["extra"]["observation_token_ids"] == [20, 21]
    assert call["extra"]["policy_versions"] == [3, 3]
    assert answer["extra"]["learner"]["advantage"] == [0.7, 0.8, 0.9]
    # the whole episode, exactly: prompt + each turn's completion and what followed it
    agents = [s for s in doc["steps"] if s["source"] == "agent"]
    rebuilt = agents[0]["metrics"]["prompt_token_ids"] + [
        t for s in agents for t in s["metrics"]["completion_token_ids"]
        + s["extra"]["observation_token_ids"]]
    assert rebuilt == rec["tokens"]["id"]
    assert doc["extra"]["reward"] == 1.0 and doc["extra"]["token_exact"]
    assert doc["final_metrics"] == {"total_prompt_tokens": 10, "total_completion_tokens": 5,
                                    "total_steps": 4}
    assert doc["agent"]["model_name"] == "tiny"


def test_turns_that_do_not_match_the_tokens_keep_the_conversation_only():
    rec = _two_turn_record(traced=False)
    rec["tokens"]["mask"] = [0] * 10  # e.g. an infra failure before any sampling
    doc = trajectory(rec)
    assert not doc["extra"]["token_exact"]
    assert all("metrics" not in s for s in doc["steps"])
    assert [s["source"] for s in doc["steps"]] == ["system", "user", "agent", "agent"]


def test_a_gateway_episode_of_two_segments_says_where_they_start():
    rec = _two_turn_record(traced=False)
    rec["segments"] = [5]  # the harness rewrote its history before its second call
    rec["messages"] = [{"role": "system", "content": "summary: 2+2 was asked"},
                       {"role": "assistant", "content": "4"}]  # the last segment's view
    doc = trajectory(rec)
    assert doc["extra"]["segments"] == [5] and not doc["extra"]["token_exact"]
    assert [s["source"] for s in doc["steps"]] == ["system", "agent"]
    assert "segments" not in trajectory(_two_turn_record())["extra"]


def test_the_cli_exports_a_run_and_refuses_bad_input(tmp_path, capsys):
    run = hostile_run(tmp_path / "run", episodes=3)
    assert main(["export", "atif", str(run), str(tmp_path / "out")]) == 0
    files = sorted((tmp_path / "out" / "train").glob("*.json"))
    assert [f.name for f in files] == ["train-0.json", "train-1.json", "train-2.json"]
    doc = json.loads(files[0].read_text())
    assert doc["extra"]["id"] == 0 and doc["steps"][2]["source"] == "agent"
    assert main(["export", "atif", str(run), str(tmp_path / "o2"), "--split", "nope"]) == 2
    assert "has no kept rollouts of split(s) ['nope']" in capsys.readouterr().err
    assert main(["export", "atif", str(tmp_path / "none"), str(tmp_path / "o3")]) == 2


VALIDATE = """
import json, sys
from pathlib import Path
from harbor.models.trajectories import Trajectory
n = 0
for f in sorted(Path(sys.argv[1]).rglob("*.json")):
    t = Trajectory.model_validate_json(f.read_text())
    assert t.schema_version == "ATIF-v1.8", t.schema_version
    n += 1
print(n)
"""


@pytest.mark.slow
def test_exported_trajectories_validate_with_harbors_model(harbor_python, tmp_path):
    # a real run (training samples, both evaluations), a hostile one, and `eval --trajectories`
    run = tmp_path / "run"
    assert main(["train", "--set", "env=sao_gym/MathTIR-v0", "--set", "env_kwargs={}",
                 "--set", "warm_start=null", "--set", "total_steps=2",
                 "--set", "rollout.batch_size=2", "--set", "rollout.concurrency=4",
                 "--set", "rollout.max_new_tokens=24", "--set", "rollout.max_episode_steps=3",
                 "--set", "rollout.max_context_tokens=1536",
                 "--set", "learner.critic_warmup_steps=0", "--set", "eval.episodes=2",
                 "--set", "checkpoint.every=0", "--out", str(run)]) == 0
    out = tmp_path / "atif"
    assert main(["export", "atif", str(run), str(out / "run")]) == 0
    kept = RolloutReader(run)
    assert sum(len(kept.episodes(s)) for s in kept.splits()) == len(list(out.rglob("*.json")))
    with RolloutWriter(tmp_path / "odd", "train") as w:  # tool results without a call etc.
        rec = _two_turn_record()
        rec["messages"] = [{"role": "tool", "content": "orphan"}, *rec["messages"]]
        rec.pop("id")
        w.write(rec)
    assert main(["export", "atif", str(hostile_run(tmp_path / "hostile")),
                 str(out / "hostile")]) == 0
    assert main(["export", "atif", str(tmp_path / "odd"), str(out / "odd")]) == 0
    assert main(["eval", "--run", str(run), "--episodes", "2",
                 "--trajectories", str(out / "eval")]) == 0
    assert len(list((out / "eval").glob("*.json"))) == 2
    check = subprocess.run([str(harbor_python), "-c", VALIDATE, str(out)], capture_output=True,
                           text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-3000:]
    assert int(check.stdout) == len(list(out.rglob("*.json"))) >= 12
    assert "eval_step2" in kept.splits()  # `eval --run` kept its episodes for the viewer
