"""Harbor export of ``sao_gym/CoqProof-v0`` tasks: the env's ``harbor`` hook.

:func:`export_task` writes one task directory (the layout common to all envs is
in :mod:`sao_gym.adapters.harbor.export`): the theorem as ``/app/Task.v`` with
its proof ``Admitted`` (``environment/``), :mod:`.harbor_grade` as
``tests/check_proof.py`` with sao-gym's own Coq checker vendored next to it,
and the reference proof, when the task has one, as ``solution/solve.sh``. The
agent writes its proof script to ``/app/proof.v``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sao_gym.adapters.harbor.export import heredoc, task_toml, vendor, write_text
from sao_gym.envs.coq_proof import checker, harbor_grade
from sao_gym.envs.coq_proof.checker import DOCKER_IMAGE

IMAGE = DOCKER_IMAGE
"""The base image of exported tasks: sao-gym's sandbox image with Coq 8.16."""


def instruction(task: Any) -> str:
    """The task's ``instruction.md``: the theorem, where the proof goes, how it is graded."""
    parts = [f"# Prove a Coq theorem ({task.id})",
             "Prove the following theorem in the Coq proof assistant (Coq 8.16)."]
    if task.context.strip():
        parts.append(f"Context (loaded before the theorem):\n\n```coq\n{task.context.strip()}"
                     "\n```")
    parts.append(f"Theorem:\n\n```coq\n{task.statement}\n```")
    parts.append(
        "`/app/Task.v` holds the context and the theorem with its proof `Admitted`. Write your "
        "proof script, the tactics that go between `Proof.` and `Qed.` (for example "
        "`intros n. induction n as [|n IH]; simpl; auto.`), to `/app/proof.v`. Only tactics "
        "are allowed (with bullets, braces, goal selectors and queries such as Show, Check or "
        "Search): no Admitted, admit, Axiom, Qed or other commands. To try a script, put it "
        "in place of `Admitted.` in a copy of Task.v (ending it with `Qed.`) and run "
        "`coqc` on the copy. The grader runs Coq on the context, the theorem and your script: "
        "reward 1 if Coq accepts the proof and the theorem depends on no axioms, else 0.")
    return "\n\n".join(parts) + "\n"


def export_task(env: Any, task: Any, out: Path, name: str) -> None:
    """Write the Harbor task directory ``out`` (named ``name``) of one task of ``env``."""
    coq = Path(checker.__file__).parent
    write_text(out / "instruction.md", instruction(task))
    write_text(out / "task.toml", task_toml(
        env.spec.id, task.id, name, f"Prove the Coq theorem {task.name}",
        ["sao-gym", "coq", "theorem-proving", *([task.topic] if task.topic else [])],
        {"category": "theorem-proving", "topic": task.topic,
         **({"difficulty": task.difficulty} if task.difficulty else {})},
        agent_s=900, verifier_s=120 + 2 * env.timeout_s, memory_mb=2048))
    head = task.context.rstrip("\n") + "\n\n" if task.context.strip() else ""
    write_text(out / "environment" / "app" / "Task.v", (
        f"{head}{task.statement}\nProof.\n  (* Write the proof script in /app/proof.v. *)\n"
        f"Admitted.\n{task.epilogue}"))
    write_text(out / "environment" / "Dockerfile", (
        f"# sao-gym CoqProof task {task.id}: the theorem in /app/Task.v; the proof goes to\n"
        f"# /app/proof.v. {IMAGE} is sao-gym's sandbox image with Coq 8.16, built\n"
        "# offline by `sao-gym sandbox build-image --tag sao-gym-sandbox-coq:latest\n"
        "# --extra-packages coq,ocaml-base,ocaml,libcoq-core-ocaml,libzarith-ocaml,"
        "libfindlib-ocaml`.\n"
        f"FROM {IMAGE}\nUSER root\nWORKDIR /app\nCOPY app/ /app/\n"))
    tests = out / "tests"
    record = {k: v for k, v in task.to_dict().items() if k not in ("reference_proof", "name")}
    write_text(tests / "task.json", json.dumps({"task": record, "timeout_s": env.timeout_s},
                                               indent=1, ensure_ascii=False) + "\n")
    write_text(tests / "check_proof.py",
               Path(harbor_grade.__file__).read_text(encoding="utf-8"))
    vendor(tests, {f"envs.coq_proof.{m}": coq / f"{m}.py" for m in ("checker", "coqlex", "tasks")})
    write_text(tests / "test.sh", (
        "#!/bin/bash\n"
        f"# Grader of sao-gym CoqProof task {task.id}: check /app/proof.v with sao-gym's Coq\n"
        "# checker (tests/vendor/) and write 1 (Coq accepts it, no axioms) or 0 to\n"
        "# /logs/verifier/reward.txt.\nmkdir -p /logs/verifier\n"
        "if ! python3 -I /tests/check_proof.py /tests/task.json /app/proof.v; then\n"
        "  echo 'the grader failed: reward 0'\n  echo 0 > /logs/verifier/reward.txt\nfi\n"),
        0o755)
    if task.reference_proof:
        delim, proof = heredoc(task.reference_proof, "SAO_GYM_PROOF")
        write_text(out / "solution" / "solve.sh", (
            f"#!/bin/bash\n# Reference solution of sao-gym CoqProof task {task.id}.\n"
            f"set -euo pipefail\ncat > /app/proof.v <<'{delim}'\n{proof}{delim}\n"), 0o755)
