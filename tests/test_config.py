import pytest

from sao_gym.runtime.config import ConfigError, TrainConfig, load_config, save_config


def test_defaults_and_overrides():
    cfg = load_config(None, ["total_steps=20", "batch_size=2", "learner.lr=1e-4",
                             "mode=sync", "env_kwargs={num_operands: 3}", "max_episode_steps=4"])
    assert (cfg.total_steps, cfg.batch_size, cfg.mode) == (20, 2, "sync")
    assert cfg.learner.lr == 1e-4 and isinstance(cfg.learner.lr, float)
    assert cfg.env_kwargs == {"num_operands": 3} and cfg.max_episode_steps == 4
    assert TrainConfig().loggers == ["jsonl"]
    assert load_config(None, ["logger=tensorboard,jsonl"]).loggers == ["jsonl", "tensorboard"]


def test_env_kwargs_default_to_the_demo_options_of_that_env_only():
    from sao_gym.runtime.config import DEMO_ENV_KWARGS

    demo = DEMO_ENV_KWARGS["sao_gym/Arithmetic-v0"]
    assert demo and TrainConfig().env_kwargs == demo
    assert TrainConfig().env_kwargs is not demo  # a copy: configs never share it
    # another environment gets its own defaults, explicit options replace the demo's
    assert load_config(None, ["env=sao_gym/MathTIR-v0"]).env_kwargs == {}
    assert load_config(None, ["env_kwargs={}"]).env_kwargs == {}
    assert load_config(None, ["env_kwargs.max_value=5"]).env_kwargs == {"max_value": 5}


def test_yaml_file_and_round_trip(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algorithm: grpo\ngroup_size: 4\nbatch_size: 8\nlearner:\n  eps_low: 0.25\n")
    cfg = load_config(path, ["seed=3"])
    assert cfg.algorithm == "grpo" and cfg.learner.group_size == 4  # propagated to the learner
    assert cfg.learner.eps_low == 0.25 and cfg.seed == 3
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == cfg


@pytest.mark.parametrize("overrides, message", [
    (["total_stepz=3"], "unknown key(s) ['total_stepz']"),
    (["learner.lrr=3"], "unknown key(s) ['learner.lrr']"),
    (["batch_size=abc"], "bad value for batch_size"),
    (["batch_size=2.5"], "bad value for batch_size"),
    (["temperature=hot"], "bad value for temperature"),
    (["mode=fast"], "mode must be one of"),
    (["algorithm=ppo"], "algorithm must be one of"),
    (["batch_size=6", "group_size=4"], "multiple of group_size"),
    (["algorithm=grpo"], "needs group_size >= 2"),
    (["total_steps=0"], "total_steps must be >= 1"),
    (["learner.aggregation=sum"], "aggregation must be one of"),
    (["learner=3"], "must be a mapping"),
    (["novalue"], "key=value"),
])
def test_bad_configs_fail_clearly(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value)


def test_unknown_key_lists_valid_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("batchsize: 3\n")
    with pytest.raises(ConfigError, match="valid keys: .*batch_size"):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "list.yaml")


def test_example_configs_load():
    from pathlib import Path

    paths = sorted((Path(__file__).resolve().parents[1] / "examples" / "configs").glob("*.yaml"))
    assert paths
    for path in paths:
        load_config(path)
