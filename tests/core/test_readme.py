import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_example_runs(tmp_path):
    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    assert len(code.splitlines()) <= 25
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    reward, reason, turns = out.stdout.split()
    assert reward == "1.0" and reason == "StopReason.TERMINATED" and 1 <= float(turns) <= 10


def test_examples_run(tmp_path):
    for script in sorted((ROOT / "examples").glob("*.py")):
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             cwd=tmp_path, timeout=120)
        assert out.returncode == 0, f"{script.name} failed:\n{out.stderr[-2000:]}"
