"""The wheel's layout and dependencies; the light install's import surface."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "tokenizers", "matplotlib")


@pytest.mark.slow
def test_wheel_layout(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )
    wheel = next(tmp_path.glob("sao_gym-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    # sao_gym_verifiers: the taskset module verifiers imports (top-level only, by its rules)
    assert top == {"sao_gym", "sao_gym_verifiers",
                   next(n for n in top if n.endswith(".dist-info"))}
    verifiers_taskset = "sao_gym/adapters/verifiers_taskset/"
    for folder in ("envs", "agents", "sao_gym"):
        for src in (ROOT / folder).rglob("*.py"):
            rel = src.relative_to(ROOT / folder).as_posix()
            target = f"sao_gym/{rel}" if folder == "sao_gym" else f"sao_gym/{folder}/{rel}"
            target = target.replace(verifiers_taskset, "sao_gym_verifiers/")
            assert target in names, f"{src} is missing from the wheel as {target}"
    assert "sao_gym/recipes/demo.yaml" in names
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: torch>=2.6; extra == \"train\"" in meta and "torch==" not in meta
    required = [line.split(":", 1)[1].strip() for line in meta.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert {r.split(">")[0].split(";")[0].strip() for r in required} == {
        "gymnasium", "aiohttp", "numpy", "pyyaml", "rich"}
    entry = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "sao-gym = sao_gym.cli:main" in entry


def test_import_sao_gym_does_not_import_torch():
    code = "import sys, sao_gym, sao_gym.agents, sao_gym.inference; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd="/")
    assert out.stdout.strip() == "False"


LIGHT_SURFACE = """
import sys
import sao_gym
from sao_gym.utils.env_checker import check_agent_env
env = sao_gym.make("sao_gym/Arithmetic-v0")
env.reset(seed=0)
env.step("hello")
env.close()
check_agent_env(sao_gym.make("sao_gym/Arithmetic-v0"))
from sao_gym.cli import main
assert main(["check", "sao_gym/Arithmetic-v0", "--episodes", "2"]) == 0
print(sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[1:]))
"""


def test_the_light_surface_never_imports_the_train_extra():
    """import, make, the checker and `sao-gym check` need no torch, transformers, matplotlib."""
    out = subprocess.run([sys.executable, "-c", LIGHT_SURFACE, *HEAVY], capture_output=True,
                         text=True, check=True, cwd="/", timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
