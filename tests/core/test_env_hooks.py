"""An environment's training hooks travel with its registration: register(..., oracle=,
hooks=), env_oracle and env_hook for plain, module:id, entry-point and built-in ids."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import gymnasium
import pytest

import sao_gym
from sao_gym import registration
from sao_gym.registration import env_hook, env_oracle, unregister

COUNTER = "tests.helpers:CounterEnv"


@pytest.fixture(autouse=True)
def forget_registrations():
    """Every id a test registers (directly, by a module, by an entry point) is unregistered."""
    before = set(registration._AGENT_ENV_IDS)
    yield
    for env_id in set(registration._AGENT_ENV_IDS) - before:
        unregister(env_id)


def write_module(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    importlib.invalidate_caches()


def say_hello(messages, task):
    return f"hello {task['n']} after {len(messages)}"


# ----- oracles: callable, lazy string, module:id ----------------------------------------------

def test_a_callable_oracle_is_found_as_given():
    sao_gym.register("hooks/Callable-v0", COUNTER, oracle=say_hello)
    assert env_oracle("hooks/Callable-v0") is say_hello
    assert env_hook("hooks/Callable-v0", "oracle") is say_hello
    assert env_oracle("hooks/Callable-v0")([{"role": "user", "content": "x"}], {"n": 4}) == \
        "hello 4 after 1"


def test_a_lazy_oracle_is_imported_on_first_use_only(on_path):
    write_module(on_path, "user_hooks_lazy", '''
        def oracle(messages, task):
            return "submit(" + str(task["answer"]) + ")"
    ''')
    sao_gym.register("hooks/Lazy-v0", COUNTER, oracle="user_hooks_lazy:oracle")
    assert "user_hooks_lazy" not in sys.modules  # registering imports nothing
    found = env_oracle("hooks/Lazy-v0")
    assert found is sys.modules["user_hooks_lazy"].oracle
    assert found([], {"answer": 17}) == "submit(17)"
    assert env_oracle("hooks/Lazy-v0") is found  # the same function every time


def test_module_colon_id_imports_the_module_that_registers_the_oracle(on_path):
    write_module(on_path, "user_hooks_mod", '''
        import sao_gym

        def oracle(messages, task):
            return "the answer is " + str(task["answer"])

        def grade(text):
            return float(text == "ok")

        sao_gym.register("mymod/HookedEnv-v0", "tests.helpers:CounterEnv",
                         oracle=oracle, hooks={"grader": "user_hooks_mod:grade"})
    ''')
    assert "mymod/HookedEnv-v0" not in gymnasium.registry
    found = env_oracle("user_hooks_mod:mymod/HookedEnv-v0")
    module = sys.modules["user_hooks_mod"]
    assert found is module.oracle and found([], {"answer": 5}) == "the answer is 5"
    # once imported, the bare id finds the same hooks
    assert env_oracle("mymod/HookedEnv-v0") is module.oracle
    grader = env_hook("mymod/HookedEnv-v0", "grader")
    assert grader is module.grade and grader("ok") == 1.0 and grader("no") == 0.0
    assert env_hook("user_hooks_mod:mymod/HookedEnv-v0", "grader") is module.grade


def test_an_env_without_an_oracle_gives_none():
    sao_gym.register("hooks/Plain-v0", COUNTER)
    sao_gym.register("hooks/OnlyGrader-v0", COUNTER, hooks={"grader": say_hello})
    assert env_oracle("hooks/Plain-v0") is None
    assert env_oracle("hooks/OnlyGrader-v0") is None
    assert env_hook("hooks/OnlyGrader-v0", "grader") is say_hello
    assert env_hook("hooks/OnlyGrader-v0", "harbor") is None


def test_an_unknown_id_is_an_unregistered_env():
    with pytest.raises(gymnasium.error.UnregisteredEnv, match="hooks/Nope-v0"):
        env_oracle("hooks/Nope-v0")


# ----- broken and refused hooks ---------------------------------------------------------------

@pytest.mark.parametrize("reference, cause", [
    ("user_hooks_not_a_module:grade", "ModuleNotFoundError"),
    ("os.path:no_such_function", "AttributeError"),
])
def test_a_hook_that_cannot_be_imported_names_the_env_and_the_hook(reference, cause):
    sao_gym.register("hooks/Broken-v0", COUNTER, hooks={"grader": reference})
    with pytest.raises(ImportError) as info:
        env_hook("hooks/Broken-v0", "grader")
    message = str(info.value)
    assert message.startswith(f"the grader hook of hooks/Broken-v0 ({reference!r}) cannot be "
                              f"loaded: {cause}: ")
    assert "\n" not in message
    # the env's other hooks are unaffected
    assert env_oracle("hooks/Broken-v0") is None


def test_a_broken_lazy_oracle_names_the_oracle_hook():
    sao_gym.register("hooks/BrokenOracle-v0", COUNTER, oracle="user_hooks_gone.sub:oracle")
    with pytest.raises(ImportError, match=r"^the oracle hook of hooks/BrokenOracle-v0 "
                                          r"\('user_hooks_gone\.sub:oracle'\)"):
        env_oracle("hooks/BrokenOracle-v0")


def test_a_lazy_hook_that_is_not_callable_is_a_type_error():
    sao_gym.register("hooks/NotCallable-v0", COUNTER, hooks={"grader": "os:sep"})
    with pytest.raises(TypeError, match=r"the grader hook of hooks/NotCallable-v0 \('os:sep'\) "
                                        "is not callable"):
        env_hook("hooks/NotCallable-v0", "grader")


@pytest.mark.parametrize("hook", [3, "grade", "module:", ":grade", "my module:grade",
                                  "mod:fn-name", ["mod:fn"]])
def test_a_hook_that_is_neither_callable_nor_module_function_is_refused(hook):
    with pytest.raises(TypeError, match=r"hook 'grader' of 'hooks/Refused-v0' must be a "
                                        r"callable or a 'module:function' string"):
        sao_gym.register("hooks/Refused-v0", COUNTER, hooks={"grader": hook})
    assert "hooks/Refused-v0" not in gymnasium.registry  # refused before registering
    with pytest.raises(TypeError, match="hook 'oracle' of 'hooks/Refused-v0'"):
        sao_gym.register("hooks/Refused-v0", COUNTER, oracle=hook)
    assert "hooks/Refused-v0" not in gymnasium.registry


def test_dotted_module_and_attribute_references_are_accepted():
    sao_gym.register("hooks/Dotted-v0", COUNTER,
                     hooks={"grader": "sao_gym.registration:MissingExtra.__init__"})
    assert env_hook("hooks/Dotted-v0", "grader") is registration.MissingExtra.__init__


def test_oracle_given_twice_is_refused():
    with pytest.raises(ValueError, match=r"give the oracle as oracle=\.\.\., not also in hooks"):
        sao_gym.register("hooks/Twice-v0", COUNTER, oracle=say_hello,
                         hooks={"oracle": say_hello})
    assert "hooks/Twice-v0" not in gymnasium.registry
    # the oracle given only through hooks is the oracle
    sao_gym.register("hooks/ViaHooks-v0", COUNTER, hooks={"oracle": say_hello})
    assert env_oracle("hooks/ViaHooks-v0") is say_hello


def test_unregister_drops_the_hooks():
    sao_gym.register("hooks/Temporary-v0", COUNTER, oracle=say_hello,
                     hooks={"grader": say_hello})
    unregister("hooks/Temporary-v0")
    with pytest.raises(gymnasium.error.UnregisteredEnv):
        env_oracle("hooks/Temporary-v0")
    sao_gym.register("hooks/Temporary-v0", COUNTER)  # the same id again, without hooks
    assert env_oracle("hooks/Temporary-v0") is None
    assert env_hook("hooks/Temporary-v0", "grader") is None


@pytest.mark.filterwarnings("ignore:.*Overriding environment")
def test_registering_again_replaces_the_hooks():
    sao_gym.register("hooks/Again-v0", COUNTER, oracle=say_hello)
    sao_gym.register("hooks/Again-v0", COUNTER, hooks={"grader": say_hello})
    assert env_oracle("hooks/Again-v0") is None
    assert env_hook("hooks/Again-v0", "grader") is say_hello


# ----- built-in and entry-point envs ----------------------------------------------------------

def test_builtin_oracles():
    from sao_gym.envs.arithmetic.oracle import arithmetic_oracle

    assert env_oracle("sao_gym/Arithmetic-v0") is arithmetic_oracle
    assert env_oracle("sao_gym/HeavyTail-v0") is None


def test_an_entry_point_env_has_its_oracle_by_its_bare_id(on_path, monkeypatch):
    write_module(on_path, "user_hooks_plugin", '''
        import sao_gym

        def oracle(messages, task):
            return "plugin turn " + str(len(messages))

        sao_gym.register("plugin/Hooked-v0", "tests.helpers:CounterEnv",
                         oracle="user_hooks_plugin:oracle")
    ''')
    info = on_path / "user_hooks_plugin_dist-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: user_hooks_plugin_dist\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{registration.ENTRY_POINT_GROUP}]\nhooked = user_hooks_plugin\n")
    importlib.invalidate_caches()
    monkeypatch.setattr(registration, "_entry_points_loaded", False)
    assert "plugin/Hooked-v0" not in gymnasium.registry
    found = env_oracle("plugin/Hooked-v0")  # unknown yet: loads the entry points
    assert found is sys.modules["user_hooks_plugin"].oracle
    assert found([{"role": "user", "content": "go"}], {}) == "plugin turn 1"
    assert "plugin/Hooked-v0" in sao_gym.env_ids()
