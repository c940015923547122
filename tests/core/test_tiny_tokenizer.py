"""The tiny model's tokenizer: an env's own text gets merges, and the built-in corpus
favours no built-in environment's tools."""

from __future__ import annotations

import re

import gymnasium
import pytest
from gymnasium.envs.registration import load_env_creator
from transformers import AutoTokenizer

import sao_gym
from sao_gym.models import _training_corpus, tiny_model
from sao_gym.tools import ToolEnv

ENV_TEXT = ["inspect_crate(zebra/quokka7.bin)", "The key is in zebra/quokka7.bin."] * 100


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = tiny_model(tmp_path_factory.mktemp("plain_tok"), hidden_size=64, num_layers=1)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    path = tiny_model(tmp_path_factory.mktemp("env_tok"), hidden_size=64, num_layers=1,
                      corpus=ENV_TEXT)
    return AutoTokenizer.from_pretrained(path)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_the_env_corpus_shortens_its_own_names(plain, fitted):
    for text in ("inspect_crate", "zebra/quokka7.bin", "inspect_crate(zebra/quokka7.bin)",
                 "The key is in zebra/quokka7.bin."):
        assert len(ids(fitted, text)) < len(ids(plain, text)), text
        assert fitted.decode(ids(fitted, text)) == text  # still round-trips
    assert len(ids(fitted, "zebra")) == 1 and len(ids(plain, "zebra")) > 1
    assert len(ids(fitted, "inspect_crate")) <= 3  # inspect, _, crate


def test_other_text_still_round_trips(fitted):
    text = "Ünïcödé, tabs\tand 12345 → ok?"
    assert fitted.decode(ids(fitted, text)) == text


# Not a ToolEnv (its tools come from the remote env it connects to), and seconds to import.
DYNAMIC_TOOLS = {"sao_gym.adapters.openenv:OpenEnvAgentEnv"}


def builtin_tool_names() -> set[str]:
    """The tools of the built-in ToolEnvs (their tool_specs), the interpreter "python" aside."""
    names: set[str] = set()
    for env_id in sao_gym.env_ids():
        entry = gymnasium.spec(env_id).entry_point
        if not (isinstance(entry, str) and entry.startswith(("sao_gym.envs.",
                                                              "sao_gym.adapters."))
                and entry not in DYNAMIC_TOOLS):
            continue
        cls = load_env_creator(entry)
        if isinstance(cls, type) and issubclass(cls, ToolEnv):
            names |= set(cls.tool_specs())
    return names - {"python"}


@pytest.fixture(scope="module")
def corpus_text() -> str:
    return "\n".join(_training_corpus())


@pytest.fixture(scope="module")
def tool_names() -> set[str]:
    names = builtin_tool_names()
    assert {"calculator", "submit", "bash", "read_file"} <= names, names  # not a vacuous scan
    return names


def test_the_builtin_corpus_holds_no_builtin_tool_as_a_tool(corpus_text, tool_names):
    for name in tool_names:
        as_tool = re.compile(rf"(?<![\w]){re.escape(name)}\(|\"{re.escape(name)}\"")
        assert not as_tool.search(corpus_text), name




def test_the_builtin_corpus_holds_no_builtin_tool_name(corpus_text, tool_names):
    word = {name: re.compile(rf"(?<![A-Za-z]){re.escape(name)}(?![A-Za-z])")
            for name in tool_names}
    found = sorted(name for name, pattern in word.items() if pattern.search(corpus_text))
    assert found == []


def test_the_corpus_argument_comes_after_the_builtin_corpus():
    built_in = _training_corpus()
    assert _training_corpus(ENV_TEXT) == built_in + ENV_TEXT
    assert _training_corpus() == built_in  # deterministic
