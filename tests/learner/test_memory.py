"""The learner memory estimate: its counts against real models, its arithmetic by hand."""

from __future__ import annotations

import pytest

from sao_gym.learner.config import LoraSettings
from sao_gym.learner.memory import QWEN25, Shape, learner_memory, table


def test_parameter_counts_match_real_models(tiny_model_path):
    from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

    from sao_gym.learner.lora import add_lora
    from sao_gym.models import load_policy

    qwen = load_policy(tiny_model_path)[0]
    shape = Shape.of(AutoConfig.from_pretrained(tiny_model_path))
    assert shape.qkv_bias  # Qwen2 has q/k/v biases
    assert shape.parameters() == sum(p.numel() for p in qwen.parameters())
    llama_config = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=80,
                               num_hidden_layers=3, num_attention_heads=4,
                               num_key_value_heads=2, tie_word_embeddings=False)
    llama = LlamaForCausalLM(llama_config)
    assert Shape.of(llama_config).parameters() == sum(p.numel() for p in llama.parameters())
    lora = LoraSettings(rank=4, target_modules=("q_proj", "down_proj"))
    adapted = add_lora(qwen, lora)
    adapters = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert shape.lora_parameters(4, ("q_proj", "down_proj")) == adapters


def test_the_estimate_adds_up_by_hand():
    cfg = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, vocab_size=1000,
               num_attention_heads=4, num_key_value_heads=2, model_type="llama")
    s = Shape.of(cfg)
    n = 1000 * 64 + 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64) + 64
    assert s.parameters() == n
    one = learner_memory(cfg, critic=False, microbatch_tokens=100)
    assert (one.params, one.grads, one.optimizer) == (4 * n, 4 * n, 8 * n)
    per_layer = s.activations_per_token() * 100 * 4
    head = 3 * 100 * 1000 * 4  # 100 rows (under the chunk's 33,554 of a 1,000 vocab)
    assert one.activations == 2 * per_layer + head + 2 * per_layer
    four = learner_memory(cfg, engine="fsdp", ranks=4, critic=False, microbatch_tokens=100)
    assert four.state == one.state // 4 and four.activations == one.activations
    assert four.gathered == (1000 * 64 + 2 * s.layer_parameters()) * 4
    ckpt = learner_memory(cfg, critic=False, microbatch_tokens=100, gradient_checkpointing=True)
    assert ckpt.activations == 2 * 64 * 100 * 4 + per_layer + head + 2 * per_layer
    long = learner_memory(cfg, critic=False, microbatch_tokens=100_000)
    rows = 2**25 // 1000  # the head never holds more than one chunk's logits
    assert long.activations == 2 * s.activations_per_token() * 100_000 * 4 * 2 + 3 * rows * 4000
    lora = learner_memory(cfg, critic=False, lora_rank=8)
    r8 = s.lora_parameters(8)
    assert (lora.params, lora.grads, lora.optimizer) == (4 * (n + r8), 4 * r8, 8 * r8)
    sao = learner_memory(cfg, microbatch_tokens=100)
    assert sao.critic == 4 * n + 12 * (n - s.attention_parameters())
    offload = learner_memory(cfg, critic=False, optimizer_offload=True)
    assert offload.optimizer == 0
    with pytest.raises(ValueError, match="one rank"):
        learner_memory(cfg, ranks=2)


def test_the_table_covers_the_sizes_and_more_ranks_never_need_more():
    text = table()
    for size in ("0.5B", "1.5B", "7B", "32B"):
        assert f"| {size} | full |" in text
    for config in QWEN25.values():
        for kw in ({}, {"lora_rank": 16}, {"gradient_checkpointing": True}):
            one = learner_memory(config, **kw)
            eight = learner_memory(config, engine="fsdp", ranks=8, **kw)
            assert eight.total < one.total
    assert not learner_memory(QWEN25["7B"]).fits(80)  # 7B with its critic: not on one card
    assert learner_memory(QWEN25["0.5B"], microbatch_tokens=2048).fits(80)
