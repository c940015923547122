import dataclasses
from pathlib import Path

import pytest

from sao_gym.learner.learner import LearnerConfig
from sao_gym.runtime.config.loader import load_config, load_recipe, recipe_path, save_config
from sao_gym.runtime.config.schema import ConfigError, TrainConfig

ROOT = Path(__file__).resolve().parents[3]


def test_sections_and_overrides():
    cfg = load_config(None, ["total_steps=20", "rollout.batch_size=2", "learner.lr=1e-4",
                             "mode=sync", "env_kwargs={num_operands: 3}",
                             "rollout.max_episode_steps=4", "checkpoint.every=0"])
    assert (cfg.total_steps, cfg.rollout.batch_size, cfg.mode) == (20, 2, "sync")
    assert cfg.learner.lr == 1e-4 and isinstance(cfg.learner.lr, float)
    assert cfg.env_kwargs == {"num_operands": 3} and cfg.rollout.max_episode_steps == 4
    assert cfg.checkpoint.every == 0 and cfg.max_staleness == 0  # sync mode: bound 0
    assert load_config(None, ["rollout.max_staleness=3"]).max_staleness == 3
    assert TrainConfig().logging.names == ["jsonl"]
    assert load_config(None, ["logging.loggers=tensorboard,jsonl"]).logging.names == [
        "jsonl", "tensorboard"]


def test_library_defaults_are_the_papers():
    cfg = TrainConfig()
    assert cfg.learner == LearnerConfig()
    assert (cfg.learner.lr, cfg.learner.critic_warmup_steps, cfg.learner.critic_updates) == (
        1e-6, 10, 2)
    assert cfg.rollout.batch_size == 128 and cfg.rollout.group_size == 1
    assert cfg.rollout.temperature == 1.0 and cfg.rollout.top_p == 1.0
    assert cfg.env_kwargs == {} and cfg.warm_start is None


def test_the_demo_is_a_recipe():
    demo = load_recipe("demo")
    assert recipe_path("demo").parent == ROOT / "sao_gym" / "recipes"
    assert demo.env_kwargs == {"operators": "+"} and demo.learner.lr == 2e-4
    assert demo.learner.critic_warmup_steps == 0 and demo.warm_start is not None
    assert demo.rollout.batch_size == 16 and demo.model == "tiny"
    # recipe values are overridable like any other
    assert load_recipe("demo", ["warm_start=null"]).warm_start is None
    assert load_recipe("demo", ["warm_start.steps=3"]).warm_start.steps == 3
    with pytest.raises(ConfigError, match="shipped recipes: .*demo"):
        recipe_path("nope")


def test_warm_start_section_from_null():
    cfg = load_config(None, ["warm_start.steps=7", "warm_start.oracle={direct_rate: 1.0}"])
    assert cfg.warm_start.steps == 7 and cfg.warm_start.oracle == {"direct_rate": 1.0}
    assert cfg.warm_start.episodes == 2048  # the section's defaults fill the rest


def test_yaml_file_and_round_trip(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algorithm: grpo\nrollout:\n  group_size: 4\n  batch_size: 8\n"
                    "learner:\n  eps_low: 0.25\nwarm_start:\n  steps: 3\n")
    cfg = load_config(path, ["seed=3"])
    assert cfg.algorithm == "grpo" and cfg.rollout.group_size == 4
    assert cfg.learner.eps_low == 0.25 and cfg.seed == 3
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == cfg
    assert dataclasses.asdict(load_config(tmp_path / "saved.yaml")) == cfg.to_dict()


@pytest.mark.parametrize("overrides, message", [
    (["total_stepz=3"], "unknown key(s) ['total_stepz']"),
    (["batch_size=3"], "did you mean 'rollout.batch_size'"),
    (["warm_start_steps=3"], "did you mean 'warm_start.steps'"),
    (["learner.lrr=3"], "unknown key(s) ['learner.lrr']"),
    (["rollout.batchsize=3"], "valid keys: ['rollout.batch_size'"),
    (["rollout.batch_size=abc"], "bad value for rollout.batch_size"),
    (["rollout.batch_size=2.5"], "bad value for rollout.batch_size"),
    (["rollout.temperature=hot"], "bad value for rollout.temperature"),
    (["rollout.temperature=0"], "rollout.temperature must be > 0"),
    (["rollout.top_p=0.9"], "training needs top_p = 1.0"),
    (["mode=fast"], "mode must be one of"),
    (["algorithm=ppo"], "unknown algorithm 'ppo'"),
    (["algorithm=no_such_module_xyz:ALGO"], "cannot import 'no_such_module_xyz'"),
    (["algorithm=sao_gym.learner.losses:dis_policy_loss"], "not a sao_gym.learner.algorithms"),
    (["rollout.batch_size=6", "rollout.group_size=4", "algorithm=grpo"],
     "multiple of rollout.group_size"),
    (["algorithm=grpo"], "needs rollout.group_size >= 2"),
    (["rollout.group_size=2", "rollout.batch_size=4"], "must be 1"),
    (["total_steps=0"], "total_steps must be >= 1"),
    (["rollout.concurrency=0"], "rollout.concurrency must be >= 1"),
    (["checkpoint.keep=0"], "checkpoint.keep must be >= 1"),
    (["warm_start.target_success=2"], "warm_start.target_success must be in (0, 1]"),
    (["warm_start.min_sampled_success=-0.1"], "warm_start.min_sampled_success must be in"),
    (["warm_start.target_metric=beam"], "warm_start.target_metric must be 'sampled' or 'greedy'"),
    (["warm_start.demonstration_format=hermes"], "demonstration_format must be 'oracle' or"),
    (["rollout.tool_schemas=python"], "rollout.tool_schemas must be 'env' or 'signature'"),
    (["learner.lr_warmup_steps=-1"], "lr_warmup_steps must be >= 0"),
    (["inference.backend=tgi"], "inference.backend must be one of"),
    (["logging.loggers=csv"], "logging.loggers: unknown ['csv']"),
    (["learner.aggregation=sum"], "aggregation must be one of"),
    (["learner=3"], "must be a mapping"),
    (["rollout=null"], "must be a mapping"),
    (["novalue"], "key=value"),
])
def test_bad_configs_fail_clearly(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value)


def test_bad_files_fail_clearly(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("batchsize: 3\n")
    with pytest.raises(ConfigError, match="valid keys: .*rollout"):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_example_configs_and_recipes_load():
    paths = sorted((ROOT / "examples" / "configs").glob("*.yaml"))
    paths += sorted((ROOT / "sao_gym" / "recipes").glob("*.yaml"))
    assert len(paths) >= 3
    for path in paths:
        load_config(path)


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[3] / "examples" / "configs")
                                        .glob("*.yaml")) + [recipe_path("demo")],
                         ids=lambda p: p.stem)
def test_the_same_yaml_runs_on_ray_with_only_runtime_changed(path):
    local = load_config(path)
    on_ray = load_config(path, ["runtime=ray"])
    assert dataclasses.replace(on_ray, runtime="local") == local
    workers, per_worker = on_ray.ray.rollout_workers, on_ray.episodes_per_worker
    # the episodes of rollout.concurrency, shared out over the workers
    assert workers * per_worker >= local.rollout.concurrency > workers * (per_worker - 1)


def test_ray_section_is_validated():
    assert load_config(None, ["ray.episodes_per_worker=5"]).episodes_per_worker == 5
    assert load_config(None, ["rollout.concurrency=5", "ray.rollout_workers=2"]
                       ).episodes_per_worker == 3
    for bad, message in [("runtime=cluster", "runtime must be one of"),
                         ("ray.rollout_workers=0", "ray.rollout_workers must be >= 1"),
                         ("ray.episodes_per_worker=0", "ray.episodes_per_worker must be >= 1"),
                         ("ray.worker_num_cpus=-1", "ray.worker_num_cpus must be >= 0"),
                         ("ray.server_num_gpus=-1", "ray.server_num_gpus must be >= 0"),
                         ("ray.server_actors=maybe", "expected bool"),
                         ("ray.server_actors=true", "set inference.backend=vllm_server and "
                                                    "inference.launch"),
                         ("inference.max_server_restarts=-1",
                          "inference.max_server_restarts must be >= 0"),
                         ("ray.adress=auto", "unknown key")]:
        with pytest.raises(ConfigError, match=message):
            load_config(None, [bad] if "max_server" not in bad else [
                bad, "inference.backend=vllm_server", "inference.launch=1"])


def test_each_inference_backend_has_a_section_of_its_own_keys(tmp_path):
    from sao_gym.inference.sections import HFSection, VLLMSection, VLLMServerSection

    assert load_config(None, []).inference == HFSection()
    served = load_config(None, ["inference.backend=vllm_server", "inference.launch=2",
                                "inference.server=sao"])
    assert isinstance(served.inference, VLLMServerSection) and served.inference.launch == 2
    assert isinstance(load_config(None, ["inference.backend=vllm"]).inference, VLLMSection)
    with pytest.raises(ConfigError, match="inference.urls is a key of inference.backend "
                                          "vllm_server, not hf"):
        load_config(None, ["inference.urls=['http://x:1']"])
    with pytest.raises(ConfigError, match="max_batch_size is a key of inference.backend hf "
                                          "or vllm_server, not vllm"):
        load_config(None, ["inference.backend=vllm", "inference.max_batch_size=4"])
    with pytest.raises(ConfigError, match="needs inference.urls"):
        load_config(None, ["inference.backend=vllm_server"])
    path = tmp_path / "c.yaml"
    save_config(served, path)
    assert load_config(path) == served  # the section and its backend read back


def test_the_learner_takes_rays_thread_rule_unless_told():
    from sao_gym.runtime.place.ray.learner import learner_threads

    threads = {over: learner_threads(load_config(None, list(over)).ray) for over in [
        (), ("ray.learner_num_cpus=0.5",), ("ray.learner_num_cpus=3.7",),
        ("ray.learner_num_cpus=3", "ray.learner_threads=8")]}
    assert list(threads.values()) == [1, 1, 3, 8]


def test_ray_shares_servers_between_workers():
    from sao_gym.runtime.config.build import backend_factory

    urls = [f"http://127.0.0.1:{8000 + i}" for i in range(3)]
    cfg = load_config(None, ["runtime=ray", "inference.backend=vllm_server",
                             f"inference.urls={urls}"])
    assert [backend_factory(cfg).share(i, 2).urls for i in range(2)] == [
        [urls[0], urls[2]], [urls[1]]]
    with pytest.raises(ValueError, match="at least one server per rollout worker"):
        backend_factory(cfg).share(0, 4)
    launch = load_config(None, ["runtime=ray", "inference.backend=vllm_server",
                                "inference.launch=4"])
    assert backend_factory(launch).share(1, 2).launch == 2
    with pytest.raises(ValueError, match="multiple of ray.rollout_workers"):
        backend_factory(load_config(None, ["runtime=ray", "inference.backend=vllm_server",
                                           "inference.launch=3"])).share(0, 2)
    hf = backend_factory(load_config(None, []))
    assert hf.share(1, 2) is hf  # an in-process backend: nothing to deal out


def test_yaml_files_take_scientific_notation_for_floats(tmp_path):
    # YAML 1.1 reads 2e-4 (no dot) as a string; --set reads it as a float: both must agree
    path = tmp_path / "c.yaml"
    path.write_text("learner:\n  lr: 2e-4\n  critic_lr: 1E+3\nwarm_start:\n"
                    "  target_success: 5e-1\n")
    cfg = load_config(path)
    assert cfg.learner.lr == 2e-4 and isinstance(cfg.learner.lr, float)
    assert cfg.learner.critic_lr == 1e3 and cfg.warm_start.target_success == 0.5
    assert load_config(None, ["learner.lr=2e-4"]).learner.lr == cfg.learner.lr
    for text, message in [("learner:\n  lr: fast\n", "bad value for learner.lr"),
                          ("learner:\n  lr: nan\n", "bad value for learner.lr"),
                          ("learner:\n  lr: '-inf'\n", "bad value for learner.lr"),
                          ("learner:\n  lr: 1e999\n", "bad value for learner.lr"),
                          ("rollout:\n  batch_size: 1e3\n", "bad value for rollout.batch_size"),
                          ("model: 1e3\n", None)]:
        path.write_text(text)
        if message is None:  # a string field keeps the string
            assert load_config(path).model == "1e3"
            continue
        with pytest.raises(ConfigError, match=message):
            load_config(path)
    for over in ["learner.lr=nan", "learner.lr=+inf", "learner.lr=-Infinity"]:
        with pytest.raises(ConfigError, match="bad value for learner.lr"):
            load_config(None, [over])


def test_every_moved_key_gets_its_hint():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["batch_size=2", "checkpoint_every=3"])
    assert "'batch_size' (did you mean 'rollout.batch_size'?)" in str(e.value)
    assert "'checkpoint_every' (did you mean 'checkpoint.every'?)" in str(e.value)
    with pytest.raises(ConfigError) as e:  # a key with no hint is still listed, with the keys
        load_config(None, ["batch_size=2", "total_stepz=3"])
    assert "did you mean 'rollout.batch_size'?" in str(e.value)
    assert "total_stepz" in str(e.value) and "valid keys:" in str(e.value)


def test_mode_is_the_spelling_of_the_staleness_bound(tmp_path):
    """`mode: sync` is `rollout.max_staleness: 0`, stored once; the saved config reads back."""
    sync = load_config(None, ["mode=sync"])
    assert sync.rollout.max_staleness == 0 and sync.mode == "sync" and sync.max_staleness == 0
    assert load_config(None, ["rollout.max_staleness=0"]).mode == "sync"
    assert load_config(None, ["mode=async"]).mode == "async"
    assert load_config(None, ["mode=async", "rollout.max_staleness=3"]).max_staleness == 3
    assert load_config(None, ["rollout.max_staleness=2", "mode=sync"]).max_staleness == 0
    for bad, message in ((["mode=async", "rollout.max_staleness=0"], "0 is mode: sync"),
                         (["mode=batch"], "mode must be one of")):
        with pytest.raises(ConfigError, match=message):
            load_config(None, bad)
    path = tmp_path / "c.yaml"
    save_config(sync, path)
    assert load_config(path) == sync


async def test_a_sync_run_samples_batch_invariant_unless_told_otherwise(tiny_model_path):
    from sao_gym.runtime.config.build import rollout_factory, run_parts

    run = ["env=sao_gym/Arithmetic-v0", "rollout.max_new_tokens=16",
           "rollout.max_context_tokens=256"]

    def invariant(*overrides, training=True):
        cfg = load_config(None, [*run, *overrides])
        return (run_parts(cfg).rollouts if training
                else rollout_factory(cfg)).backend.batch_invariant

    assert invariant("mode=sync") is True
    assert invariant("mode=async") is False
    assert invariant("mode=sync", "inference.batch_invariant=false") is False
    assert invariant("mode=async", "inference.batch_invariant=true") is True
    assert invariant("mode=sync", training=False) is False  # evaluation keeps batching
    with pytest.raises(ValueError, match="batch_invariant"):
        load_config(None, ["inference.backend=vllm_server", "inference.batch_invariant=true"])
    section = run_parts(load_config(None, [*run, "mode=sync"])).rollouts.backend
    backend = section(tiny_model_path, version=0, seed=0)
    try:
        assert backend.max_batch_size == 1  # each sequence decoded alone
    finally:
        await backend.aclose()
