"""The FSDP2 engine over 2 gloo ranks trains like the single-device engine.

A fixed batch of real multi-turn rollouts (the tiny model sampling on
HeavyTail, rewards that vary) is trained for 3 learner steps by the
single-device learner in this process and by 2 ranks with ``engine: fsdp``
(``torch.multiprocessing.spawn``): the weights of policy and critic agree
within 1e-5, for a tiny Qwen2 and a tiny Llama, for SAO (with its critic)
and GRPO. The micro-batch budget is small, so each rank runs several
micro-batches, one rank pads with a weight-0 repeat, and SAO's two policy
minibatches make two optimizer steps per learner step.

The two engines sum the same terms in another order, so they agree up to
float32 rounding, which Adam and the loss's clip boundaries amplify in
proportion to the learning rate: at lr 1e-4 the largest difference is
3e-7 to 5e-6 while the weights move by 5e-4 to 6e-4; the single-device
learner with another micro-batch budget (96 against 400 tokens) differs
from itself by 1e-7 to 2e-6 on the same cases (at lr 1e-3, by up to 1.7e-5).
"""

import asyncio
import pickle
import socket
from dataclasses import replace

import pytest
import torch

from sao_gym.learner.config import LearnerConfig

CONFIG = LearnerConfig(lr=1e-4, critic_warmup_steps=0, critic_updates=2,
                       max_tokens_per_microbatch=96, policy_minibatches=2, seed=3)
STEPS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model_path(request, tmp_path_factory):
    from sao_gym.models import tiny_model

    path = tiny_model(tmp_path_factory.mktemp("qwen2"), hidden_size=64, num_layers=2,
                      head_dim=32)
    if request.param == "qwen2":
        return path
    from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    q = AutoConfig.from_pretrained(path)
    config = LlamaConfig(vocab_size=q.vocab_size, hidden_size=q.hidden_size,
                         intermediate_size=q.intermediate_size,
                         num_hidden_layers=q.num_hidden_layers,
                         num_attention_heads=q.num_attention_heads,
                         num_key_value_heads=q.num_key_value_heads, head_dim=32,
                         max_position_embeddings=q.max_position_embeddings,
                         tie_word_embeddings=False, bos_token_id=q.bos_token_id,
                         eos_token_id=q.eos_token_id, pad_token_id=q.pad_token_id)
    torch.manual_seed(0)
    llama = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(config).save_pretrained(llama)
    AutoTokenizer.from_pretrained(path).save_pretrained(llama)
    return str(llama)


@pytest.fixture(scope="module")
def rollouts(model_path, tmp_path_factory):
    """Two episodes on each of 4 tasks (a group each), sampled by the model: multi-turn."""
    import sao_gym
    from sao_gym.agents import LLMAgent
    from sao_gym.inference.hf.backend import HFBackend
    from sao_gym.rollout import play_episode

    async def play():
        backend = HFBackend(model_path, seed=0)
        try:
            return await asyncio.gather(*(play_episode(
                lambda: sao_gym.make("sao_gym/HeavyTail-v0", latency_median_s=0.001,
                                     turns_median=3.0, max_episode_steps=4),
                lambda i=i: LLMAgent(backend, backend.tokenizer, max_new_tokens=10, seed=i),
                seed=i // 2) for i in range(8)))
        finally:
            await backend.aclose()

    batch = [replace(r, group_id=r.seed) for r in asyncio.run(play())]
    assert not any(r.infra_failure for r in batch)
    assert max(len(r.messages) for r in batch) >= 5  # several turns
    assert len({r.reward for r in batch}) == 2  # rewards vary: a signal to learn from
    path = tmp_path_factory.mktemp("batch") / "rollouts.pkl"
    path.write_bytes(pickle.dumps(batch))
    return str(path), batch


def _single(algorithm, model_path, batch, group_size, trace=()):
    from sao_gym.learner.learner import build_learner

    learner = build_learner(algorithm, model_path, CONFIG, total_steps=STEPS,
                            group_size=group_size)
    metrics = [learner.update(batch, trace=trace) for _ in range(STEPS)]
    critic = learner.critic_engine.weights() if learner.critic_engine else None
    return {"policy": learner.policy_engine.weights(), "critic": critic, "metrics": metrics,
            "version": learner.policy_version, "trace": learner.trace}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["sao", "grpo"])
def test_two_fsdp_ranks_train_like_one_device(algorithm, model_path, rollouts, tmp_path):
    import torch.multiprocessing as mp

    from sao_gym.models import load_policy
    from tests.learner.fsdp_ranks import run

    path, batch = rollouts
    group_size = 2 if algorithm == "grpo" else 1
    trace = [0, 3, 6]  # the per-token quantities, gathered from the ranks that computed them
    one = _single(algorithm, model_path, batch, group_size, trace)
    out = tmp_path / "ranks.pt"
    job = {"config": CONFIG, "algorithm": algorithm, "policy": model_path, "rollouts": path,
           "steps": STEPS, "out": str(out), "group_size": group_size, "trace": trace}
    mp.spawn(run, args=(2, _free_port(), job), nprocs=2, join=True)
    two = torch.load(out, weights_only=False)
    assert two["version"] == one["version"] == STEPS * CONFIG.policy_minibatches
    assert two["scores_tokens"]  # the chunked LM head, run as an FSDP forward method
    start = load_policy(model_path)[0].state_dict()
    moved = _max_diff(start, one["policy"])
    assert moved > 3e-4  # training moved the weights ...
    assert _max_diff(one["policy"], two["policy"]) < 1e-5  # ... and both engines alike
    if algorithm == "sao":
        assert _max_diff(one["critic"], two["critic"]) < 1e-5
    for m1, m2 in zip(one["metrics"], two["metrics"], strict=True):
        for key in ("loss/policy", "policy/grad_norm", "sao/ratio_mean", "advantage/mean",
                    "learner/tokens", *(("loss/value", "critic/explained_variance")
                                        if algorithm == "sao" else ())):
            assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key
    assert sorted(two["trace"]) == trace
    for i in trace:
        assert two["trace"][i].keys() == one["trace"][i].keys()
        for key, values in one["trace"][i].items():
            assert two["trace"][i][key] == pytest.approx(values, rel=1e-3, abs=1e-4), (i, key)


@pytest.mark.parametrize("algorithm", ["sao", "grpo"])
def test_gradient_checkpointing_gives_the_same_training(algorithm, model_path, rollouts):
    from sao_gym.learner.engine import checkpoint_activations
    from sao_gym.learner.learner import build_learner

    _, batch = rollouts
    group_size = 2 if algorithm == "grpo" else 1
    plain = _single(algorithm, model_path, batch, group_size)
    learner = build_learner(algorithm, model_path, replace(CONFIG, gradient_checkpointing=True),
                            total_steps=STEPS, group_size=group_size)
    inner = learner.policy.model if hasattr(learner.policy, "model") else learner.policy
    assert inner.gradient_checkpointing  # it is on ...
    metrics = [learner.update(batch) for _ in range(STEPS)]
    assert _max_diff(plain["policy"], learner.policy_engine.weights()) < 1e-6  # ... same steps
    if algorithm == "sao":
        assert learner.critic.backbone.gradient_checkpointing
        assert _max_diff(plain["critic"], learner.critic_engine.weights()) < 1e-6
    assert metrics[-1]["loss/policy"] == pytest.approx(plain["metrics"][-1]["loss/policy"],
                                                       rel=1e-5, abs=1e-7)
    assert checkpoint_activations(torch.nn.Linear(2, 2)) == 0
    with pytest.raises(ValueError, match="no transformers model"):
        from sao_gym.learner.engine import local_engine

        local_engine(torch.nn.Linear(2, 2), replace(CONFIG, gradient_checkpointing=True), 1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("model_path", ["qwen2"], indirect=True)
def test_sharded_checkpoints_resume_on_another_number_of_ranks(model_path, rollouts, tmp_path):
    """One device -> 2 ranks -> one device through ``save_state``/``load_state`` (DCP).

    The first checkpoint is written while the policy's optimizer has not
    stepped yet (critic warm-up): resuming must train exactly as a run that
    never stopped.
    """
    import torch.multiprocessing as mp

    from sao_gym.learner.learner import build_learner
    from sao_gym.learner.state import read_state
    from tests.learner.fsdp_ranks import run

    path, batch = rollouts
    config = replace(CONFIG, critic_warmup_steps=1)
    straight = build_learner("sao", model_path, config, total_steps=STEPS)
    for _ in range(STEPS):
        straight.update(batch)
    first = build_learner("sao", model_path, config, total_steps=STEPS)
    first.update(batch)
    assert not first.policy_opt.state and first.critic_opt.state  # only the critic stepped
    first.save_state(tmp_path / "one")
    assert not first.policy_opt.state  # reading the state started nothing
    out = tmp_path / "ranks.pt"
    job = {"config": config, "algorithm": "sao", "policy": model_path, "rollouts": path,
           "steps": STEPS - 1, "out": str(out), "load": str(tmp_path / "one"),
           "save": str(tmp_path / "two")}
    mp.spawn(run, args=(2, _free_port(), job), nprocs=2, join=True)
    two = torch.load(out, weights_only=False)
    assert two["steps_done"] == STEPS and two["version"] == straight.policy_version
    assert _max_diff(straight.policy_engine.weights(), two["policy"]) < 1e-5
    assert _max_diff(straight.critic_engine.weights(), two["critic"]) < 1e-5

    last = build_learner("sao", model_path, config, total_steps=STEPS)
    last.load_state(tmp_path / "two")  # written by 2 ranks, read by one device
    saved, loaded, ref = read_state(tmp_path / "two"), last.state_dict(), straight.state_dict()
    assert (loaded["steps_done"], loaded["policy_version"]) == (STEPS, straight.policy_version)
    for model in ("policy", "critic"):
        assert _max_diff(saved[model], loaded[model]) == 0.0
        assert _max_diff(two[model], loaded[model]) == 0.0
        opt, ref_opt = loaded[f"{model}_opt"]["state"], ref[f"{model}_opt"]["state"]
        assert opt.keys() == ref_opt.keys()
        for name in opt:
            assert opt[name]["step"] == ref_opt[name]["step"]
            assert _max_diff({"m": opt[name]["exp_avg"]}, {"m": ref_opt[name]["exp_avg"]}) < 1e-5
