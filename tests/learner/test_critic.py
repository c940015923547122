"""ValueModel: value alignment, values after a token, frozen attention per architecture."""

import pytest
import torch

from sao_gym.learner.critic import (
    ATTENTION_PROJECTIONS,
    ValueModel,
    attention_parameter_names,
    values_before,
)
from tests.learner.helpers import table_critic

TINY = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1)


def _tiny_backbone(kind):
    from transformers import AutoModel, LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    config = {
        "qwen2": lambda: Qwen2Config(**TINY),
        "llama": lambda: LlamaConfig(**TINY, attention_bias=True),  # biases frozen too
        "qwen3": lambda: Qwen3Config(**TINY, head_dim=8),
        "qwen3_moe": lambda: Qwen3MoeConfig(**TINY, head_dim=8, num_experts=4,
                                            num_experts_per_tok=2, moe_intermediate_size=8),
    }[kind]()
    torch.manual_seed(0)
    return AutoModel.from_config(config)


def _expected_frozen(backbone):
    """q/k/v/o projection weights and biases of every layer, written out by hand."""
    out = set()
    for i in range(TINY["num_hidden_layers"]):
        for proj in "qkvo":
            for leaf in ("weight", "bias"):
                name = f"layers.{i}.self_attn.{proj}_proj.{leaf}"
                if name in dict(backbone.named_parameters()):
                    out.add(name)
    return out


@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen3", "qwen3_moe"])
def test_attention_freeze_is_exactly_the_projections(kind):
    backbone = _tiny_backbone(kind)
    assert backbone.config.model_type == kind and kind in ATTENTION_PROJECTIONS
    expected = _expected_frozen(backbone)
    assert any(n.endswith("q_proj.bias") for n in expected) == (kind in ("qwen2", "llama"))
    assert attention_parameter_names(backbone) == expected
    critic = ValueModel(backbone, freeze="attention")
    frozen = {n for n, p in critic.named_parameters() if not p.requires_grad}
    assert frozen == {"backbone." + n for n in expected}
    trains = {n for n, p in critic.named_parameters() if p.requires_grad}
    for i in range(TINY["num_hidden_layers"]):
        layer = f"backbone.layers.{i}."
        assert {layer + "input_layernorm.weight", layer + "post_attention_layernorm.weight"} \
            <= trains
        if kind.startswith("qwen3"):
            assert {layer + "self_attn.q_norm.weight", layer + "self_attn.k_norm.weight"} \
                <= trains
        mlp = {n for n in trains if n.startswith(layer + "mlp.")}
        if kind == "qwen3_moe":  # experts and router train
            assert {layer + "mlp.gate.weight", layer + "mlp.experts.gate_up_proj",
                    layer + "mlp.experts.down_proj"} <= mlp
        else:
            assert len(mlp) == 3
    assert {"backbone.embed_tokens.weight", "backbone.norm.weight", "head.weight",
            "head.bias"} <= trains
    assert not any("norm" in n for n in frozen)
    assert ValueModel(backbone, freeze=None).frozen_parameter_names() == set()


def test_unknown_architecture_falls_back_to_linear_layers_in_attention_blocks():
    from transformers import AutoModel, MistralConfig

    backbone = AutoModel.from_config(MistralConfig(**TINY))
    backbone.config.model_type = "not_in_the_table"
    assert attention_parameter_names(backbone) == _expected_frozen(backbone)
    with pytest.raises(ValueError, match="found no attention projections"):
        attention_parameter_names(table_critic({}).backbone)
    with pytest.raises(ValueError, match="found no attention projections"):
        ValueModel(table_critic({}).backbone, freeze="attention")


def _critic_step(critic, lr=1e-2):
    opt = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=lr)
    ids = torch.randint(0, 1000, (2, 12))
    v = critic(ids, torch.ones_like(ids))
    ((v - 1.0) ** 2).mean().backward()
    opt.step()


@pytest.mark.parametrize("freeze", ["attention", None])
def test_frozen_attention_stays_bit_identical(tiny_model_path, freeze):
    critic = ValueModel.from_pretrained(tiny_model_path, freeze=freeze)
    before = {n: p.detach().clone() for n, p in critic.named_parameters()}
    _critic_step(critic)
    attn = {"backbone." + n for n in attention_parameter_names(critic.backbone)}
    rest = set(before) - attn
    assert attn and rest
    assert any("post_attention_layernorm" in n for n in rest)
    changed = {n for n, p in critic.named_parameters() if not torch.equal(p, before[n])}
    if freeze == "attention":
        assert not changed & attn
        assert {n for n in rest if "embed" not in n} <= changed  # the pre-MLP norm trains
    else:
        assert attn <= changed
    assert "head.weight" in changed and "head.bias" in changed


def test_critic_values_are_aligned_and_save_load_roundtrips(tiny_model_path, tmp_path):
    critic = ValueModel.from_pretrained(tiny_model_path, seed=3)
    assert torch.all(critic.head.bias == 0)
    assert 0.01 < critic.head.weight.std().item() < 0.03
    _critic_step(critic)
    ids = torch.randint(0, 1000, (3, 9))
    attn = torch.ones_like(ids)
    v = critic(ids, attn)
    assert v.shape == (3, 9) and torch.all(v[:, 0] == 0)
    # value at t depends only on tokens < t
    ids2 = ids.clone()
    ids2[:, 5] = (ids2[:, 5] + 1) % 1000
    v2 = critic(ids2, attn)
    assert torch.allclose(v[:, :6], v2[:, :6], atol=1e-6)
    assert not torch.allclose(v[:, 6:], v2[:, 6:])
    # the value after token t is the value before token t + 1; after the last one is new
    after = critic.values_after(ids, attn)
    assert after.shape == (3, 9)
    assert torch.allclose(after[:, :-1], v[:, 1:], atol=1e-6)
    assert torch.equal(values_before(after), v)
    after2 = critic.values_after(ids2, attn)
    assert torch.allclose(after[:, :5], after2[:, :5], atol=1e-6)
    assert not torch.allclose(after[:, 5], after2[:, 5])
    critic.save_pretrained(tmp_path / "critic")
    again = ValueModel.from_pretrained(tmp_path / "critic")
    assert torch.allclose(again(ids, attn), v, atol=1e-6)
    with pytest.raises(ValueError):
        ValueModel(critic.backbone, freeze="mlp")
    with pytest.raises(FileNotFoundError):
        ValueModel.from_pretrained(tmp_path / "nowhere")


def test_shallow_critic_reads_the_first_layers_and_roundtrips(tiny_model_path, tmp_path):
    full = ValueModel.from_pretrained(tiny_model_path)
    layers = full.backbone.config.num_hidden_layers
    assert layers >= 2
    shallow = ValueModel.from_pretrained(tiny_model_path, num_layers=layers - 1)
    assert len(shallow.backbone.layers) == layers - 1
    assert shallow.backbone.config.num_hidden_layers == layers - 1
    types = getattr(shallow.backbone.config, "layer_types", None)
    assert types is None or len(types) == layers - 1
    ids = torch.randint(0, 1000, (2, 7))
    attn = torch.ones_like(ids)
    with torch.no_grad():
        hidden = full.backbone(input_ids=ids, attention_mask=attn,
                               output_hidden_states=True).hidden_states[layers - 1]
        expected = shallow.head(full.backbone.norm(hidden)).squeeze(-1)
        assert torch.allclose(shallow.values_after(ids, attn), expected, atol=1e-5)
        assert not torch.allclose(full.values_after(ids, attn), expected, atol=1e-3)
    frozen = attention_parameter_names(shallow.backbone)
    assert frozen and all(int(n.split(".")[1]) < layers - 1 for n in frozen)
    _critic_step(shallow)
    shallow.save_pretrained(tmp_path / "critic")
    again = ValueModel.from_pretrained(tmp_path / "critic", num_layers=layers - 1)
    assert len(again.backbone.layers) == layers - 1
    assert torch.allclose(again(ids, attn), shallow(ids, attn), atol=1e-6)
    for bad in (0, layers + 1):
        with pytest.raises(ValueError, match="decoder layers"):
            ValueModel.from_pretrained(tiny_model_path, num_layers=bad)


def test_table_critic_gives_hand_values():
    critic = table_critic({5: 0.25, 6: -1.5})
    ids = torch.tensor([[5, 6, 7]])
    assert critic.values_after(ids, torch.ones_like(ids)).tolist() == [[0.25, -1.5, 0.0]]
    assert critic(ids, torch.ones_like(ids)).tolist() == [[0.0, 0.25, -1.5]]


def test_docstring_examples():
    import doctest

    from sao_gym.learner import algorithms, critic

    for module in (critic, algorithms):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
