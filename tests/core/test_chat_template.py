"""with_chat_template (a checkpoint with another chat template) and the chat_template key."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from sao_gym.models import (
    CHAT_TEMPLATES,
    CHATML_TOOLS_TEMPLATE,
    COMPACT_TOOLS_TEMPLATE,
    load_policy,
    tiny_model,
    with_chat_template,
)
from sao_gym.runtime.config.loader import load_config
from sao_gym.runtime.config.schema import ConfigError, TrainConfig

WEIGHTS_AND_CONFIGS = ("model.safetensors", "config.json", "generation_config.json")
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]


def _digests(path: str | Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
            for f in Path(path).iterdir() if f.is_file()}


def test_chat_templates():
    assert CHAT_TEMPLATES == {"chatml": CHATML_TOOLS_TEMPLATE, "compact": COMPACT_TOOLS_TEMPLATE}


def test_with_chat_template_links_weights_and_swaps_the_tokenizer(tiny_model_path, tmp_path):
    import torch

    before = _digests(tiny_model_path)
    out = with_chat_template(tiny_model_path, "compact", tmp_path / "compact")
    assert out == str(tmp_path / "compact")
    for name in WEIGHTS_AND_CONFIGS:
        link = Path(out) / name
        assert link.is_symlink(), name
        assert Path(os.readlink(link)) == (Path(tiny_model_path) / name).resolve()
    assert not (Path(out) / "tokenizer.json").is_symlink()
    assert not (Path(out) / "tokenizer_config.json").is_symlink()
    # the original checkpoint is untouched: same files, same bytes, same template
    assert _digests(tiny_model_path) == before
    original = AutoTokenizer.from_pretrained(tiny_model_path)
    assert original.chat_template == CHATML_TOOLS_TEMPLATE
    templated = AutoTokenizer.from_pretrained(out)
    assert templated.chat_template == COMPACT_TOOLS_TEMPLATE
    # only the template changed: same vocabulary and special tokens
    assert templated.get_vocab() == original.get_vocab()
    assert (templated.eos_token_id, templated.pad_token_id) == (original.eos_token_id,
                                                                original.pad_token_id)

    model, tok = load_policy(out)
    base, _ = load_policy(tiny_model_path)
    assert tok.chat_template == COMPACT_TOOLS_TEMPLATE
    a, b = model.state_dict(), base.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the templates agree on plain messages and differ on how tools are listed
    messages = [{"role": "user", "content": "What is 2+3?"}]
    assert tok.apply_chat_template(messages, tokenize=False) == \
        original.apply_chat_template(messages, tokenize=False)
    compact, chatml = (t.apply_chat_template(messages, tools=TOOLS, tokenize=False)
                       for t in (tok, original))
    assert "calculator(expression): Evaluate an expression." in compact
    assert '"name": "calculator"' in chatml and len(compact) < len(chatml)


def test_with_chat_template_again_and_back(tiny_model_path, tmp_path):
    compact = with_chat_template(tiny_model_path, "compact", tmp_path / "out")
    # rerunning into the same directory (a resumed run) works and keeps the links
    assert with_chat_template(tiny_model_path, "compact", tmp_path / "out") == compact
    assert (Path(compact) / "model.safetensors").is_symlink()
    assert AutoTokenizer.from_pretrained(compact).chat_template == COMPACT_TOOLS_TEMPLATE
    # from a templated directory, back to chatml: the links still reach the original weights
    chatml = with_chat_template(compact, "chatml", tmp_path / "chatml")
    assert AutoTokenizer.from_pretrained(chatml).chat_template == CHATML_TOOLS_TEMPLATE
    assert (Path(chatml) / "model.safetensors").resolve() == \
        (Path(tiny_model_path) / "model.safetensors").resolve()
    assert AutoTokenizer.from_pretrained(compact).chat_template == COMPACT_TOOLS_TEMPLATE


def test_with_chat_template_of_a_compact_model(tmp_path):
    src = tiny_model(tmp_path / "src", hidden_size=64, num_layers=1,
                     chat_template=COMPACT_TOOLS_TEMPLATE)
    out = with_chat_template(src, "chatml", tmp_path / "out")
    assert AutoTokenizer.from_pretrained(out).chat_template == CHATML_TOOLS_TEMPLATE
    assert AutoTokenizer.from_pretrained(src).chat_template == COMPACT_TOOLS_TEMPLATE


@pytest.mark.parametrize("name", ["bogus", "ChatML", "", None])
def test_with_chat_template_rejects_unknown_names(tiny_model_path, tmp_path, name):
    with pytest.raises(ValueError, match=r"unknown chat template.*\['chatml', 'compact'\]"):
        with_chat_template(tiny_model_path, name, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ----- config -------------------------------------------------------------------------------
def test_config_chat_template():
    assert TrainConfig().chat_template is None
    assert load_config(None).chat_template is None
    assert load_config(None, ["chat_template=compact"]).chat_template == "compact"
    assert load_config(None, ["chat_template=chatml"]).chat_template == "chatml"
    assert load_config(None, ["chat_template=compact", "chat_template=null"]).chat_template is None


def test_config_chat_template_from_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("chat_template: chatml\n")
    assert load_config(path).chat_template == "chatml"


@pytest.mark.parametrize("value", ["bogus", "Compact", "''"])
def test_config_rejects_other_chat_templates(value):
    with pytest.raises(ConfigError, match=r"chat_template must be compact, chatml or null"):
        load_config(None, [f"chat_template={value}"])


def test_config_rejects_a_non_string_chat_template():
    with pytest.raises(ConfigError, match="chat_template"):
        load_config(None, ["chat_template=1"])


def test_our_templates_come_with_their_response_template(tmp_path):
    from sao_gym.models import TOOLS_RESPONSE_TEMPLATE

    other = "{% for m in messages %}{{ m.content }}{% endfor %}"
    paths = {name: tiny_model(tmp_path / name, hidden_size=64, num_layers=1, chat_template=t)
             for name, t in [("chatml", CHATML_TOOLS_TEMPLATE),
                             ("compact", COMPACT_TOOLS_TEMPLATE), ("other", other)]}
    paths["templated"] = with_chat_template(paths["other"], "chatml", tmp_path / "templated")
    loaded = {name: AutoTokenizer.from_pretrained(p).response_template
              for name, p in paths.items()}
    assert loaded == {"chatml": TOOLS_RESPONSE_TEMPLATE, "compact": TOOLS_RESPONSE_TEMPLATE,
                      "other": None, "templated": TOOLS_RESPONSE_TEMPLATE}
