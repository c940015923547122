"""The wheel installs envs/ and agents/ as sao_gym.envs and sao_gym.agents only."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
    assert top == {"sao_gym", next(n for n in top if n.endswith(".dist-info"))}
    for folder in ("envs", "agents", "sao_gym"):
        for src in (ROOT / folder).rglob("*.py"):
            rel = src.relative_to(ROOT / folder).as_posix()
            target = f"sao_gym/{rel}" if folder == "sao_gym" else f"sao_gym/{folder}/{rel}"
            assert target in names, f"{src} is missing from the wheel as {target}"
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: torch>=" in meta and "torch==" not in meta
    entry = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "sao-gym = sao_gym.cli:main" in entry


def test_import_sao_gym_does_not_import_torch():
    code = "import sys, sao_gym, sao_gym.agents, sao_gym.inference; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd="/")
    assert out.stdout.strip() == "False"
