"""The grader of an exported CoqProof task, run in the task's container (``tests/check_proof.py``).

Usage: ``python3 -I /tests/check_proof.py /tests/task.json /app/proof.v``.
Standard library and ``coqc`` only: it imports sao-gym's own checker from the
copy next to it (``tests/vendor/sao_gym/envs/coq_proof/``: ``checker.py``,
``coqlex.py``, ``tasks.py``, verbatim), so a Harbor run judges a proof exactly
as ``sao_gym/CoqProof-v0``'s ``submit_proof`` does: the script must be a proof
script (tactics only), the checker builds the file (context, the theorem under
a fresh random name, the script, ``Qed``, ``Print Assumptions``) and the
reward is 1 only when ``coqc`` accepts it and the theorem depends on no axioms.
The verdict goes to ``/logs/verifier/reward.txt`` (1 or 0) and
``/logs/verifier/verdict.json``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

VERIFIER_DIR = Path("/logs/verifier")


def coq_env() -> dict[str, str]:
    """The environment ``coqc`` runs with (findlib pointed at Coq's own library tree)."""
    env = dict(os.environ)
    where = subprocess.run(["coqc", "-where"], capture_output=True, text=True, timeout=60)
    if where.returncode == 0 and where.stdout.strip().startswith("/"):
        env.update(OCAMLFIND_CONF="/dev/null",
                   OCAMLPATH=os.path.dirname(where.stdout.strip().rstrip("/")))
    return env


def check(record: dict, script: str, timeout_s: float) -> tuple[bool, str, str]:
    """Judge ``script`` as a proof of the task ``record``: (proved, status, message)."""
    from sao_gym.envs.coq_proof import checker
    from sao_gym.envs.coq_proof.tasks import CoqTask

    task = CoqTask.from_dict(record)
    try:
        prepared = checker.prepare_script(script,
                                          extra_tactics=checker.tactic_names_in(task.context))
    except checker.ScriptRejected as e:
        return False, "rejected", f"Rejected before running Coq: {e}"
    nonce = secrets.token_hex(8)
    layout = checker._build(task, prepared.code, nonce)
    with tempfile.TemporaryDirectory(prefix="sao-coq-") as tmp:
        Path(tmp, "SaoProof.v").write_text(layout.text, encoding="utf-8")
        try:
            proc = subprocess.run(["coqc", "-q", "SaoProof.v"], cwd=tmp, capture_output=True,
                                  text=True, errors="replace", timeout=timeout_s, env=coq_env())
        except subprocess.TimeoutExpired:
            return False, "timeout", f"Coq did not finish within {timeout_s:g} s."
    if proc.returncode != 0:
        return False, "error", f"Coq rejected the proof:\n{proc.stderr.strip()[-3000:]}"
    tail = checker._after_marker(proc.stdout, f"sao_mark_{nonce}")
    if tail is None:
        return False, "error", "Coq's output was cut or garbled."
    tail = checker._rename(tail, nonce, task)
    if checker.judge_assumptions(tail):
        return True, "proved", "Coq accepted the proof and it depends on no axioms."
    return False, "axioms", "Coq accepted the proof, but it depends on axioms:\n" + tail.strip()


def main(argv: list[str]) -> int:
    """Check the proof in ``argv[2]`` against the task in ``argv[1]``; write the reward."""
    task_path, proof_path = Path(argv[1]), Path(argv[2])
    sys.path.insert(0, str(task_path.parent / "vendor"))
    spec = json.loads(task_path.read_text(encoding="utf-8"))
    VERIFIER_DIR.mkdir(parents=True, exist_ok=True)
    try:
        script = proof_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        proved, status, message = False, "missing", f"cannot read {proof_path}: {e}"
    else:
        proved, status, message = check(spec["task"], script, float(spec["timeout_s"]))
    (VERIFIER_DIR / "verdict.json").write_text(json.dumps(
        {"task_id": spec["task"]["id"], "proved": proved, "status": status,
         "message": message}, indent=1))
    (VERIFIER_DIR / "reward.txt").write_text("1\n" if proved else "0\n")
    print(f"{status}: {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
