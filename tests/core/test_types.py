import json

import pytest

from sao_gym.types import Generation, Rollout, SamplingParams, StopReason


def _rollout(**kw):
    base = dict(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0.0, -0.5, -1.0],
                policy_versions=[-1, 3, 4], reward=1.0, terminated=True, truncated=False,
                stop_reason=StopReason.TERMINATED, infra_failure=False,
                messages=[{"role": "user", "content": "hi"}], env_id="x/Y-v0", task_id="t",
                seed=7, metrics={"turns": 1.0})
    base.update(kw)
    return Rollout(**base)


def test_rollout_roundtrips_through_json():
    r = _rollout()
    d = json.loads(json.dumps(r.to_dict()))
    assert d["stop_reason"] == "terminated"
    assert Rollout.from_dict(d) == r
    assert r.num_action_tokens == 2


def test_rollout_rejects_misaligned_fields():
    with pytest.raises(ValueError, match="loss_mask"):
        _rollout(loss_mask=[1, 1])


def test_rollout_coerces_stop_reason_string():
    assert _rollout(stop_reason="max_turns").stop_reason is StopReason.MAX_TURNS


def test_generation_checks_lengths_and_reports_last_version():
    g = Generation([5, 6], [-0.1, -0.2], "stop", [1, 2])
    assert g.policy_version == 2
    assert Generation([], [], "length", []).policy_version == -1
    with pytest.raises(ValueError):
        Generation([5], [], "stop", [1])


@pytest.mark.parametrize("kw", [dict(max_new_tokens=0), dict(temperature=-1.0),
                                dict(temperature=float("nan")), dict(top_p=0.0),
                                dict(top_p=1.5)])
def test_sampling_params_validation(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_truncation_reasons():
    assert StopReason.MAX_TURNS.is_truncation and StopReason.TIME_LIMIT.is_truncation
    assert not StopReason.TERMINATED.is_truncation
    assert not StopReason.ENV_ERROR.is_truncation
