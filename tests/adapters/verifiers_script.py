"""The verifiers side of tests/adapters/test_verifiers.py, run with the scratch venv's Python.

verifiers 0.4 pins packages the test venv cannot hold, so the test runs this
script in a venv of its own and reads the one JSON document it prints last:

- ``tools ENV_ID...``: the tool list :class:`SaoGymToolset` serves over MCP
  for seed 0 of each env (``{env_id: [{name, description, input_schema}]}``);
- ``infra``: an env whose step raises, through the toolset and the task's
  scoring (the tool result, the shared state, the error scoring raised), and
  an env whose reset fails (what the toolset's first ``list_tools`` shares);
- ``eval OUT_DIR RUN_NAME -- VF_EVAL_ARGS...``: runs verifiers' own ``vf-eval``
  console script (from this venv) with the taskset ``sao-gym-verifiers`` and
  the given arguments, then summarises the traces it wrote
  (``OUT_DIR/RUN_NAME/traces.jsonl``): one record per rollout.

Until the ``sao_gym_verifiers`` package is installed, a directory (in
``OUT_DIR``) holding a link to it goes on ``PYTHONPATH`` (verifiers imports a taskset as a
top-level module).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EVAL_TIMEOUT_S = 400


def served_tools(env_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """What the toolset's MCP ``list_tools`` answers for seed 0 of each env."""
    from sao_gym.adapters.verifiers import SaoGymToolset, SaoGymToolsetConfig, load_taskset

    async def one(env_id: str) -> list[dict[str, Any]]:
        task = next(iter(load_taskset(env_id, seeds=[0])))
        toolset = SaoGymToolset(SaoGymToolsetConfig())
        await toolset.setup_task(task.data)
        try:
            return [t.model_dump(include={"name", "description", "input_schema"})
                    for t in await toolset.list_tools()]
        finally:
            await toolset.session.aclose()

    return {env_id: asyncio.run(one(env_id)) for env_id in env_ids}


def infra_failure() -> dict[str, Any]:
    """An env step that raises, as the toolset and ``SaoGymTask.score`` see it."""
    import verifiers.v1 as vf

    import sao_gym
    from sao_gym.adapters.session import EnvSession
    from sao_gym.adapters.verifiers import SaoGymToolset, SaoGymToolsetConfig, load_taskset

    def broken_env() -> Any:
        env = sao_gym.make("sao_gym/Arithmetic-v0")

        async def astep(action: Any) -> Any:
            raise ConnectionError("sandbox vanished")

        env.astep = astep
        return env

    async def run() -> dict[str, Any]:
        task = next(iter(load_taskset("sao_gym/Arithmetic-v0", seeds=[0])))
        toolset = SaoGymToolset(SaoGymToolsetConfig())
        toolset.session = EnvSession(make_env=broken_env)
        await toolset.session.areset(seed=0)
        result = await toolset.call_tool("calculator", {"expression": "1 + 1"})
        await toolset.session.aclose()
        trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data,
                                           key=task.key, hash=task.hash),
                         state=toolset.state, agent=vf.AgentInfo(config=vf.AgentConfig()))
        try:
            await task.score(trace)
            error: Any = None
        except Exception as e:  # noqa: BLE001 - what scoring raised is the result
            error = {"type": type(e).__name__, "message": str(e)}
        # A reset that fails (here: an unknown env kwarg) shows in the first MCP request.
        unresettable = SaoGymToolset(SaoGymToolsetConfig())
        await unresettable.setup_task(task.data.model_copy(update={"env_kwargs": {"bogus": 1}}))
        tools = await unresettable.list_tools()
        await unresettable.session.aclose()
        return {"is_error": result.is_error, "text": result.content[0].text,
                "state": toolset.state.model_dump(exclude={"artifacts"}), "error": error,
                "rewards": trace.rewards, "reset_failure": {
                    "tools": len(tools), "state": unresettable.state.model_dump(
                        include={"infra_failure", "done", "stop_reason", "error"})}}

    return asyncio.run(run())


def python_path(links: Path) -> str:
    """``PYTHONPATH`` for vf-eval, with ``links`` (linking ``sao_gym_verifiers``) if needed."""
    current = os.environ.get("PYTHONPATH", "")
    if importlib.util.find_spec("sao_gym_verifiers") is not None:
        return current
    links.mkdir(parents=True, exist_ok=True)
    if not (links / "sao_gym_verifiers").exists():
        package = ROOT / "sao_gym" / "adapters" / "verifiers_taskset"
        (links / "sao_gym_verifiers").symlink_to(package)
    return os.pathsep.join(p for p in (str(links), current) if p)


def run_eval(out_dir: Path, run_name: str, args: list[str]) -> dict[str, Any]:
    """Run ``vf-eval sao-gym-verifiers ARGS`` and summarise its traces."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": python_path(out_dir / f"{run_name}.pythonpath")}
    cmd = [str(bin_dir / "vf-eval"), "sao-gym-verifiers", *args, "--no-push", "--no-rich",
           "-o", str(out_dir), "--run.name", run_name]
    log = out_dir / f"{run_name}.log"
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                timeout=EVAL_TIMEOUT_S, check=False).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    traces_file = out_dir / run_name / "traces.jsonl"
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines()
                if line.strip()] if traces_file.exists() else []
    return {"returncode": rc, "command": cmd, "log_tail": _tail(log),
            "rollouts": [summary(e, t) for e in episodes for t in e.get("traces") or [{}]]}


def summary(episode: dict[str, Any], trace: dict[str, Any]) -> dict[str, Any]:
    """The parts of one trace record (and its episode's errors) the test checks."""
    rewards = trace.get("rewards") or {}
    data = (episode.get("task") or {}).get("data") or {}
    return {
        "seed": data.get("seed"), "env_id": data.get("env_id"), "name": data.get("name"),
        "reward": sum(r["score"] * r.get("weight", 1.0) for r in rewards.values() if r)
        if trace else None,
        "rewards": rewards, "metrics": trace.get("metrics"), "ok": trace.get("ok"),
        "stop_condition": trace.get("stop_condition"), "num_turns": trace.get("num_turns"),
        "errors": [{"type": e.get("type"), "message": e.get("message")}
                   for e in [*(episode.get("errors") or []), *(trace.get("errors") or [])]],
        "tools": trace.get("tools"), "sao_gym": (trace.get("info") or {}).get("sao_gym"),
    }


def _tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def main(argv: list[str]) -> None:
    """Dispatch ``tools`` / ``infra`` / ``eval`` (see module docs); print one JSON document."""
    if argv[:1] == ["tools"]:
        result: Any = served_tools(argv[1:])
    elif argv == ["infra"]:
        result = infra_failure()
    elif argv[:1] == ["eval"] and "--" in argv:
        split = argv.index("--")
        out_dir, run_name = argv[1:split]
        result = run_eval(Path(out_dir), run_name, argv[split + 1:])
    else:
        raise SystemExit(f"usage: {sys.argv[0]} tools ENV_ID... | infra | eval OUT RUN -- ARGS")
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
