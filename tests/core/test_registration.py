import importlib
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium
import pytest

import sao_gym
from sao_gym import registration
from sao_gym.registration import MissingExtra
from sao_gym.wrappers import EpisodeStatistics, TurnLimit, WallClockLimit
from tests.helpers import CounterEnv


def test_builtin_ids_and_gymnasium_registry():
    assert "sao_gym/Arithmetic-v0" in sao_gym.env_ids()
    assert gymnasium.spec("sao_gym/Arithmetic-v0").max_episode_steps == 8


def test_register_requires_a_version():
    with pytest.raises(ValueError, match="versioned"):
        sao_gym.register("tests/Echo", "tests.helpers:EchoEnv")


def test_make_builds_the_wrapper_stack_and_passes_kwargs():
    sao_gym.register("tests/Counter-v0", "tests.helpers:CounterEnv", max_episode_steps=4,
                     kwargs={"target": 2})
    env = sao_gym.make("tests/Counter-v0", target=9, max_seconds=60)
    assert isinstance(env, EpisodeStatistics) and isinstance(env.env, WallClockLimit)
    assert isinstance(env.env.env, TurnLimit) and env.env.env.max_turns == 4
    assert env.unwrapped.target == 9
    assert env.unwrapped.spec.id == "tests/Counter-v0"
    assert env.unwrapped.spec.kwargs == {"target": 9}
    bare = sao_gym.make("tests/Counter-v0", max_episode_steps=None, record_statistics=False)
    assert isinstance(bare, TurnLimit)  # the registered limit still applies


def test_make_unknown_id_names_the_known_ones():
    with pytest.raises(gymnasium.error.UnregisteredEnv, match="sao_gym/Arithmetic-v0"):
        sao_gym.make("sao_gym/Nope-v0")


def test_make_refuses_plain_gymnasium_envs():
    sao_gym.register("tests/NotAgent-v0", "gymnasium.envs.classic_control:CartPoleEnv")
    with pytest.raises(TypeError, match="not an AgentEnv"):
        sao_gym.make("tests/NotAgent-v0")


# ----- module:id, entry points, clear errors -------------------------------------------------

SAO_GYM = str(Path(sys.executable).with_name("sao-gym"))

GUESS_ENV = '''
import sao_gym
from sao_gym import ToolEnv, ToolResult, tool


class Guess(ToolEnv):
    """Guess a digit."""

    async def on_reset(self, options):
        answer = int(self.np_random.integers(10))
        self.task = {"id": f"guess-{answer}", "prompt": "Guess (0-9).", "answer": answer}
        return [{"role": "user", "content": "Guess (0-9)."}], {}

    @tool(description="Guess.", parameters={
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
        "additionalProperties": False})
    async def guess(self, n: int):
        hit = n == self.task["answer"]
        return ToolResult("right" if hit else "wrong", terminated=hit, reward=float(hit))
'''


def write_module(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_make_module_colon_id_imports_the_module_first(on_path):
    write_module(on_path, "user_envs_a", GUESS_ENV + '\nsao_gym.register("user/GuessA-v0", '
                 'Guess, max_episode_steps=5)\n')
    assert "user/GuessA-v0" not in gymnasium.registry
    env = sao_gym.make("user_envs_a:user/GuessA-v0")
    assert env.unwrapped.spec.id == "user/GuessA-v0" and env.unwrapped.spec.max_episode_steps == 5
    env.close()
    sao_gym.make("user_envs_a:user/GuessA-v0").close()  # the module is imported once
    assert "user/GuessA-v0" in sao_gym.env_ids()


def test_module_colon_id_errors_are_one_clear_unregistered_env(on_path):
    write_module(on_path, "user_envs_broken", "x = 1 / 0\n")
    write_module(on_path, "user_envs_other", GUESS_ENV + '\nsao_gym.register("user/GuessB-v0", '
                 'Guess)\n')
    write_module(on_path, "user_envs_needs_torch", "import sao_gym\nimport torch\n")
    cases = {
        "user_envs_missing:user/X-v0": "cannot import module 'user_envs_missing'.*PYTHONPATH",
        "user_envs_broken:user/X-v0": "importing module 'user_envs_broken'.*ZeroDivisionError",
        "user_envs_other:user/X-v0": "registers no environment 'user/X-v0'; it registers "
                                     "user/GuessB-v0",
        ":user/X-v0": "not of the form",
    }
    for env_id, message in cases.items():
        with pytest.raises(gymnasium.error.UnregisteredEnv, match=message) as info:
            sao_gym.make(env_id)
        assert "\n" not in str(info.value)


def test_unknown_id_suggests_close_ones():
    with pytest.raises(gymnasium.error.UnregisteredEnv, match=r"did you mean sao_gym/Arithmetic"):
        sao_gym.make("sao_gym/Arithmetc-v0")
    with pytest.raises(gymnasium.error.UnregisteredEnv, match=r"did you mean sao_gym/Arithmetic"):
        sao_gym.make("Arithmetic-v0")
    with pytest.raises(gymnasium.error.UnregisteredEnv, match="'module:user/Nope-v0'"):
        sao_gym.make("user/Nope-v0")


def test_a_missing_optional_module_names_the_env_and_the_extra(monkeypatch):
    class NeedsDocker(CounterEnv):
        def __init__(self):
            import docker  # noqa: F401

    monkeypatch.setitem(sys.modules, "docker", None)  # as if not installed
    sao_gym.register("tests/NeedsDocker-v0", NeedsDocker)
    with pytest.raises(MissingExtra, match=r"^tests/NeedsDocker-v0 needs the module 'docker'"
                       r".*pip install 'sao-gym\[docker\]'$") as info:
        sao_gym.make("tests/NeedsDocker-v0")
    assert isinstance(info.value, ImportError) and info.value.extra == "docker"

    class NeedsSomethingElse(CounterEnv):
        def __init__(self):
            import sao_gym_no_such_module  # noqa: F401

    sao_gym.register("tests/NeedsSomethingElse-v0", NeedsSomethingElse)
    with pytest.raises(ModuleNotFoundError) as info:  # not ours to explain: unchanged
        sao_gym.make("tests/NeedsSomethingElse-v0")
    assert not isinstance(info.value, MissingExtra)


def test_import_optional_and_require_optional(monkeypatch):
    assert registration.import_optional("sympy", needed_by="MyEnv").__name__ == "sympy"
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    monkeypatch.setitem(sys.modules, "reasoning_gym.factory", None)
    with pytest.raises(MissingExtra, match=r"^MyEnv needs the module 'reasoning_gym'.*\[envs\]"):
        registration.import_optional("reasoning_gym.factory", needed_by="MyEnv")
    with pytest.raises(MissingExtra, match="'reasoning_gym'"):
        registration.require_optional("sympy", "reasoning_gym", needed_by="MyEnv")
    registration.require_optional("sympy", "math_verify", needed_by="MyEnv")
    with pytest.raises(ValueError, match="not an optional dependency"):
        registration.require_optional("yaml", needed_by="MyEnv")


def test_math_tir_without_the_envs_extra_says_which_extra():
    """The acceptance case: MathTIR without reasoning-gym, then without math-verify."""
    code = textwrap.dedent('''
        import sys
        sys.modules[sys.argv[1]] = None  # as if not installed
        import sao_gym
        try:
            sao_gym.make("sao_gym/MathTIR-v0")
        except ImportError as e:
            print(type(e).__name__, e)
    ''')
    for module in ("reasoning_gym", "math_verify"):
        out = subprocess.run([sys.executable, "-c", code, module], capture_output=True,
                             text=True, check=True, cwd="/", timeout=120).stdout.strip()
        assert out == (f"MissingExtra sao_gym/MathTIR-v0 needs the module {module!r}, which is "
                       "not installed: pip install 'sao-gym[envs]'")


def test_optional_modules_match_the_extras_in_pyproject():
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[2]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    imported_as = {"openenv_core": "openenv"}  # distributions whose module is named otherwise
    for module, extra in registration.OPTIONAL_MODULES.items():
        names = {req.split(">")[0].split("=")[0].split("[")[0].strip().replace("-", "_").lower()
                 for req in extras[extra]}
        names |= {imported_as[n] for n in names if n in imported_as}
        assert module in names, f"{module} is not in the {extra!r} extra"


def fake_distribution(folder: Path, name: str, entry_points: dict[str, str]) -> None:
    """A dist-info folder that importlib.metadata finds on sys.path."""
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{registration.ENTRY_POINT_GROUP}]\n{lines}")


def test_entry_points_load_lazily_once_and_a_broken_one_is_skipped(on_path, monkeypatch, caplog):
    write_module(on_path, "user_envs_plugin", GUESS_ENV + textwrap.dedent('''
        CALLS = []
        NOT_CALLABLE = 3
        sao_gym.register("plugin/ByModule-v0", Guess, max_episode_steps=3)

        def register_more():
            CALLS.append(1)
            sao_gym.env_ids()  # a plugin may look at the registry: no recursion
            sao_gym.register("plugin/ByCallable-v0", "user_envs_plugin:Guess")
    '''))
    fake_distribution(on_path, "user_envs_plugin_dist", {
        "by_module": "user_envs_plugin",
        "by_callable": "user_envs_plugin:register_more",
        "broken": "user_envs_no_such_module",
        "not_callable": "user_envs_plugin:NOT_CALLABLE",
    })
    importlib.invalidate_caches()
    monkeypatch.setattr(registration, "_entry_points_loaded", False)
    with caplog.at_level(logging.WARNING, logger="sao_gym.registration"):
        ids = sao_gym.env_ids()
    assert {"plugin/ByModule-v0", "plugin/ByCallable-v0"} <= set(ids)
    assert "sao_gym/Arithmetic-v0" in ids
    warnings = [r.getMessage() for r in caplog.records]
    assert any("'broken'" in w and "user_envs_no_such_module" in w for w in warnings), warnings
    assert any("'not_callable'" in w and "neither a module nor a callable" in w
               for w in warnings), warnings
    sao_gym.env_ids()
    assert sys.modules["user_envs_plugin"].CALLS == [1]  # loaded once


def test_make_of_an_unknown_id_loads_the_entry_points(on_path, monkeypatch):
    write_module(on_path, "user_envs_lazy", GUESS_ENV + '\nsao_gym.register("plugin/Lazy-v0", '
                 'Guess)\n')
    fake_distribution(on_path, "user_envs_lazy_dist", {"lazy": "user_envs_lazy"})
    importlib.invalidate_caches()
    monkeypatch.setattr(registration, "_entry_points_loaded", False)
    sao_gym.make("plugin/Lazy-v0").close()


# ----- the same from the command line, in fresh processes --------------------------------------

def run_cli(*args: str, cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([SAO_GYM, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


@pytest.mark.slow
def test_cli_check_module_colon_id_from_another_directory(tmp_path):
    src, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    src.mkdir()
    elsewhere.mkdir()
    write_module(src, "my_guess_env", GUESS_ENV + '\nsao_gym.register("my/Guess-v0", Guess, '
                 'max_episode_steps=10)\n')
    ok = run_cli("check", "my_guess_env:my/Guess-v0", "--episodes", "3", cwd=elsewhere,
                 pythonpath=src)
    assert ok.returncode == 0, ok.stderr
    assert "PASS: my_guess_env:my/Guess-v0" in ok.stdout and "3 random episodes" in ok.stdout
    for env_id, message in {
        "my_guess_env:my/Other-v0": "registers no environment 'my/Other-v0'",
        "no_such_module:my/Guess-v0": "cannot import module 'no_such_module'",
        "my/Guess-v0": "no environment registered as 'my/Guess-v0'",
    }.items():
        bad = run_cli("check", env_id, cwd=elsewhere, pythonpath=src)
        assert bad.returncode == 2 and bad.stdout == ""
        assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr, bad.stderr
        assert bad.stderr.startswith(f"FAIL: cannot make {env_id}: UnregisteredEnv: ")
        assert message in bad.stderr


PLUGIN_PYPROJECT = '''
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "sao-gym-test-plugin"
version = "0.1.0"

[project.entry-points."sao_gym.envs"]
guess = "sao_gym_test_plugin.envs"
more = "sao_gym_test_plugin:register_more"
broken = "sao_gym_test_plugin_gone.envs"

[tool.setuptools]
packages = ["sao_gym_test_plugin"]
'''


@pytest.mark.slow
def test_cli_lists_and_checks_an_installed_entry_point_package(tmp_path):
    src, target, elsewhere = tmp_path / "src", tmp_path / "site", tmp_path / "elsewhere"
    (src / "sao_gym_test_plugin").mkdir(parents=True)
    elsewhere.mkdir()
    (src / "pyproject.toml").write_text(PLUGIN_PYPROJECT)
    write_module(src / "sao_gym_test_plugin", "__init__", '''
        def register_more():
            import sao_gym

            sao_gym.register("plugin/More-v0", "sao_gym_test_plugin.envs:Guess")
    ''')
    write_module(src / "sao_gym_test_plugin", "envs", GUESS_ENV + '\nsao_gym.register('
                 '"plugin/Guess-v0", Guess, max_episode_steps=6)\n')
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(src)],
                   check=True, capture_output=True, timeout=300)
    listed = run_cli("envs", cwd=elsewhere, pythonpath=target)
    assert listed.returncode == 0, listed.stderr
    ids = listed.stdout.split()
    assert {"plugin/Guess-v0", "plugin/More-v0", "sao_gym/Arithmetic-v0"} <= set(ids)
    assert "'broken'" in listed.stderr and "sao_gym_test_plugin_gone" in listed.stderr
    assert "Traceback" not in listed.stderr
    checked = run_cli("check", "plugin/Guess-v0", "--episodes", "2", cwd=elsewhere,
                      pythonpath=target)
    assert checked.returncode == 0, checked.stderr
    assert "PASS: plugin/Guess-v0" in checked.stdout


def test_unregister_removes_the_id_from_both_registries():
    sao_gym.register("tests/Temporary-v0", "sao_gym.envs.arithmetic.env:ArithmeticEnv")
    assert "tests/Temporary-v0" in sao_gym.env_ids() and "tests/Temporary-v0" in gymnasium.registry
    sao_gym.registration.unregister("tests/Temporary-v0")
    assert "tests/Temporary-v0" not in sao_gym.env_ids()
    assert "tests/Temporary-v0" not in gymnasium.registry
    with pytest.raises(KeyError, match="not registered"):
        sao_gym.registration.unregister("tests/Temporary-v0")
    with pytest.raises(KeyError):
        sao_gym.registration.unregister("CartPole-v1")  # not one of ours: left alone
    assert "CartPole-v1" in gymnasium.registry
