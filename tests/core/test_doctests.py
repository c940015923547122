import doctest
import importlib

import pytest

MODULES = ["sao_gym", "sao_gym.spaces", "sao_gym.tools", "sao_gym.logging",
           "sao_gym.plotting", "sao_gym.evaluation", "sao_gym.utils.jsonl",
           "sao_gym.runtime.config.loader", "sao_gym.utils.restarts", "sao_gym.learner.algorithms",
           "sao_gym.utils.checks", "sao_gym.learner.config"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
