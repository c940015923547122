"""An interrupted warm start continues where it was saved, to the same weights."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from sao_gym.envs.arithmetic.oracle import arithmetic_oracle
from sao_gym.learner import sft as sft_module
from sao_gym.learner.sft import SFT_STATE, SFTStep
from sao_gym.models import COMPACT_TOOLS_TEMPLATE, tiny_model
from sao_gym.runtime.config.build import prepare_plan, train_plan
from sao_gym.runtime.config.loader import load_config, write_record
from sao_gym.runtime.prepare import start
from sao_gym.runtime.prepare.demonstrations import collect_demonstrations
from tests.helpers import run_sft

ENV_ID = "sao_gym/Arithmetic-v0"


class Interrupted(Exception):
    """Stands for the process dying."""


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> str:
    return tiny_model(tmp_path_factory.mktemp("resume_base"), hidden_size=64, num_layers=1,
                      seed=0, chat_template=COMPACT_TOOLS_TEMPLATE)


@pytest.fixture(scope="module")
def demos(small_model):
    tok = AutoTokenizer.from_pretrained(small_model)
    return collect_demonstrations(ENV_ID, tok, arithmetic_oracle, episodes=5, seed=0,
                                  max_new_tokens=32)


def _weights(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _dying_at(step: int, log: list[SFTStep]):
    def callback(s: SFTStep) -> None:
        log.append(s)
        if s.step == step:
            raise Interrupted
    return callback


def test_a_resumed_sft_equals_an_uninterrupted_one(small_model, demos, tmp_path):
    # 5 demonstrations in batches of 2: the data order spans passes, so it must be restored
    kw = {"steps": 9, "lr": 3e-3, "batch_size": 2, "seed": 3, "warmup_steps": 3}
    whole: list[SFTStep] = []
    straight = _weights(run_sft(small_model, demos, out_dir=tmp_path / "a", callback=whole.append,
                            **kw))
    state, log = tmp_path / "state", []
    with pytest.raises(Interrupted):
        run_sft(small_model, demos, out_dir=tmp_path / "b", callback=_dying_at(5, log),
            state_dir=state, save_every_s=0, **kw)
    assert (state / SFT_STATE).exists() and not (tmp_path / "b").exists()
    resumed: list[SFTStep] = []
    out = run_sft(small_model, demos, out_dir=tmp_path / "b", callback=resumed.append,
              state_dir=state, save_every_s=0, **kw)
    assert [s.step for s in resumed] == [6, 7, 8, 9]
    assert _same(_weights(out), straight)
    assert [s.loss for s in log + resumed] == [s.loss for s in whole]  # step for step
    assert [s.lr for s in resumed] == [s.lr for s in whole[5:]]
    assert resumed[0].elapsed_s >= log[-1].elapsed_s  # the clock goes on
    assert not (tmp_path / "b.saving").exists()


def test_a_state_saved_at_the_early_stop_is_only_saved(small_model, demos, tmp_path):
    kw = {"steps": 20, "lr": 3e-3, "batch_size": 2, "seed": 0, "check_every": 3,
          "holdout": demos[:2]}
    first: list[SFTStep] = []
    run_sft(small_model, demos[:2], out_dir=tmp_path / "probe", callback=first.append,
        **{**kw, "steps": 3, "target_success": 1.0})
    kw["target_success"] = first[-1].holdout_success  # reached at the first check, step 3
    whole: list[SFTStep] = []
    straight = _weights(run_sft(small_model, demos[:2], out_dir=tmp_path / "a",
                            callback=whole.append, **kw))
    stop = whole[-1].step
    assert whole[-1].reached and stop == 3
    log: list[SFTStep] = []
    with pytest.raises(Interrupted):  # dies after the stop's state was written
        run_sft(small_model, demos[:2], out_dir=tmp_path / "b", callback=_dying_at(stop, log),
            state_dir=tmp_path / "state", save_every_s=1e9, **kw)
    resumed: list[SFTStep] = []
    out = run_sft(small_model, demos[:2], out_dir=tmp_path / "b", callback=resumed.append,
              state_dir=tmp_path / "state", save_every_s=1e9, **kw)
    assert resumed == [] and _same(_weights(out), straight)


def test_a_state_of_another_run_is_refused(small_model, demos, tmp_path):
    kw = {"steps": 4, "lr": 3e-3, "batch_size": 2}
    with pytest.raises(Interrupted):
        run_sft(small_model, demos, out_dir=tmp_path / "a", seed=1, callback=_dying_at(2, []),
            state_dir=tmp_path / "state", save_every_s=0, **kw)
    with pytest.raises(ValueError, match="another fine-tuning run.*delete it"):
        run_sft(small_model, demos, out_dir=tmp_path / "a", seed=2, state_dir=tmp_path / "state",
            **kw)
    with pytest.raises(ValueError, match="another fine-tuning run"):
        run_sft(small_model, demos[:3], out_dir=tmp_path / "a", seed=1,
            state_dir=tmp_path / "state", **kw)


# ---------------------------------------------------------------- the train job


def _config(small_model: str, *more: str):
    return load_config(None, [f"env={ENV_ID}", f"model={small_model}", "seed=2",
                              "warm_start.steps=8", "warm_start.episodes=5",
                              "warm_start.batch_size=2", "warm_start.lr=3e-3",
                              "warm_start.target_success=null", "rollout.max_new_tokens=24",
                              "rollout.max_context_tokens=512", *more])


def _prepare(config, run: Path, *, save_every_s: float | None = None) -> str:
    """A new run's start, saving its config as the job does; the starting checkpoint."""
    run.mkdir(parents=True, exist_ok=True)
    plan = train_plan(config)
    if save_every_s is not None:
        plan = dataclasses.replace(plan, prepare=dataclasses.replace(
            plan.prepare, sft=dataclasses.replace(plan.prepare.sft, save_every_s=save_every_s)))
    return start.prepare(plan.prepare, run, save=lambda budgets: write_record(
        plan.fitted(budgets).record, run / "config.yaml")).policy


def _resume(run: Path, say) -> start.Start:
    """``--resume``'s start: the plan of the run's saved config."""
    return start.resume(prepare_plan(load_config(run / "config.yaml")), run,
                        has_checkpoint=False, say=say)


def test_train_resume_continues_an_interrupted_warm_start(small_model, tmp_path, monkeypatch):
    config = _config(small_model)
    straight = _prepare(config, tmp_path / "a")
    assert not (tmp_path / "a" / "model" / start.WARM_STATE).exists()  # done: state deleted

    real = sft_module.sft
    monkeypatch.setattr(sft_module, "sft", lambda *a, callback, **kw: real(
        *a, callback=_dying_at(4, []), **kw))
    run = tmp_path / "b"
    with pytest.raises(Interrupted):
        _prepare(config, run, save_every_s=0.0)
    partial = run / "model" / start.WARM_STATE
    assert (partial / start.DEMONSTRATIONS).exists() and (partial / "level_0" / SFT_STATE).exists()
    monkeypatch.setattr(sft_module, "sft", real)

    said: list[str] = []
    resumed = _resume(run, said.append)
    assert resumed.policy == str(run / "model" / "warm_start")
    assert resumed.budgets == prepare_plan(load_config(run / "config.yaml")).budgets
    assert any("interrupted" in line for line in said)
    assert _same(_weights(resumed.policy), _weights(straight))
    record = (Path(straight) / start.WARM_RECORD).read_text()
    assert (Path(resumed.policy) / start.WARM_RECORD).read_text() == record
    assert '"stopped_at_step": 8' in record
    assert not partial.exists()
    # a finished warm start is the start of any later resume, as it is
    assert _resume(run, said.append).policy == resumed.policy


def test_train_resume_prepares_a_warm_start_that_never_began(small_model, tmp_path):
    config = _config(small_model)
    straight = _prepare(config, tmp_path / "a")
    run = tmp_path / "b"
    _prepare(config, run)
    shutil.rmtree(run / "model" / "warm_start")  # as if killed before the demonstrations
    said: list[str] = []
    begin = _resume(run, said.append)
    assert any("before its warm start began" in line for line in said)
    assert _same(_weights(begin.policy), _weights(straight))


def test_train_resume_without_a_warm_start_starts_from_the_templated_base(small_model,
                                                                          tmp_path):
    config = _config(small_model, "warm_start=null", "chat_template=chatml")
    fresh = _prepare(config, tmp_path)
    begin = _resume(tmp_path, print)
    assert begin.policy == fresh == str(tmp_path / "model" / "templated")
