"""Kept rollouts as Harbor's Agent Trajectory Interchange Format (ATIF v1.8).

:func:`trajectory` turns one stored record (:func:`sao_gym.rollout_store.rollout_record`)
into an ATIF document, a plain dict that validates against Harbor's own
``harbor.models.trajectories.Trajectory`` (a test checks it with harbor 0.25):

- ``system`` and ``user`` messages are ``system``/``user`` steps; each
  ``assistant`` message is an ``agent`` step with its text and tool calls;
  the ``tool`` messages that answer it are that step's observation (each
  result's ``source_call_id`` is the call it answers).
- Token-exact data, where the record's action tokens split into one run per
  assistant message: an agent step's ``metrics`` hold ``completion_token_ids``
  and the sampler's ``logprobs`` of that turn, ``prompt_tokens`` (its context)
  and ``completion_tokens``; the first agent step also holds
  ``prompt_token_ids`` (the rendered prompt), and each agent step's
  ``extra.observation_token_ids`` the tokens that followed its completion, so
  ``prompt_token_ids + sum(completion_token_ids + observation_token_ids)`` is
  the whole episode as the learner saw it, with no re-tokenisation.
  ``extra.policy_versions`` (per completion token) and, for a traced training
  rollout, ``extra.learner`` (the learner's per-token quantities on the
  completion tokens) ride along.
- The root's ``extra`` holds the episode's reward, stop reason, env and task
  ids, seed, learner step and split, and for a gateway episode of several
  segments where each starts in the tokens (``segments``). Such an episode's
  messages are its last segment's conversation, so its turns and token runs
  differ in number: it is exported with ``token_exact`` false and no per-step
  token data.

:func:`export_run` writes every kept rollout of a run directory, one JSON file
an episode: ``OUT/<split>/<id>.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ATIF_VERSION = "ATIF-v1.8"
"""The ATIF schema version written."""


def _action_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each maximal run of action tokens."""
    runs, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(mask)))
    return runs


def _arguments(raw: Any) -> dict[str, Any]:
    """A tool call's arguments as a dict (ATIF's type); JSON text that is not an object is kept."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return {"_raw": raw}
        return value if isinstance(value, dict) else {"_raw": raw}
    return {"_raw": raw}


def _text(content: Any) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def trajectory(record: Mapping[str, Any], *, agent_name: str = "sao-gym",
               agent_version: str | None = None, model_name: str | None = None,
               session_id: str | None = None) -> dict[str, Any]:
    """The ATIF document (a dict) of one stored rollout record (module docs)."""
    if agent_version is None:
        from sao_gym import __version__ as agent_version
    messages = list(record.get("messages") or [])
    if not messages:
        messages = [{"role": "user", "content": ""}]  # ATIF needs a step
    tokens = record["tokens"]
    ids, mask = tokens["id"], tokens["mask"]
    runs = _action_runs(mask)
    n_agent = sum(1 for m in messages if m.get("role") == "assistant")
    exact = len(runs) == n_agent  # one run of sampled tokens per assistant turn
    learner = record.get("learner") or {}
    steps: list[dict[str, Any]] = []
    turn = 0
    for m in messages:
        role = m.get("role")
        if role == "tool":
            _observe(steps, m)
            continue
        step: dict[str, Any] = {"step_id": len(steps) + 1,
                                "source": "agent" if role == "assistant" else (
                                    "system" if role == "system" else "user"),
                                "message": _text(m.get("content"))}
        if role not in ("system", "user", "assistant"):
            step["extra"] = {"role": role}
        if role == "assistant":
            calls = [{"tool_call_id": str(c.get("id") or f"call_{turn}_{k}"),
                      "function_name": str((c.get("function") or {}).get("name", "")),
                      "arguments": _arguments((c.get("function") or {}).get("arguments"))}
                     for k, c in enumerate(m.get("tool_calls") or [])]
            if calls:
                step["tool_calls"] = calls
            if exact:
                start, end = runs[turn]
                after = runs[turn + 1][0] if turn + 1 < len(runs) else len(ids)
                metrics: dict[str, Any] = {
                    "prompt_tokens": start, "completion_tokens": end - start,
                    "completion_token_ids": list(ids[start:end]),
                    "logprobs": [x if x is not None else 0.0
                                 for x in tokens["sampler_logprob"][start:end]]}
                if turn == 0:
                    metrics["prompt_token_ids"] = list(ids[:start])
                extra: dict[str, Any] = {
                    "observation_token_ids": list(ids[end:after]),
                    "policy_versions": list(tokens["policy_version"][start:end])}
                if learner:
                    extra["learner"] = {k: v[start:end] for k, v in learner.items()
                                        if k != "step"}
                    extra["learner"]["step"] = learner.get("step")
                step["metrics"] = metrics
                step["extra"] = extra
                step["llm_call_count"] = 1
            turn += 1
        steps.append(step)
    root_extra = {k: record.get(k) for k in (
        "split", "id", "step", "env_id", "task_id", "seed", "reward", "stop_reason",
        "terminated", "truncated", "infra_failure", "group_id", "policy_version", "metrics")}
    root_extra["token_exact"] = exact
    if record.get("segments"):  # a gateway episode whose harness rewrote its history
        root_extra["segments"] = list(record["segments"])
    doc: dict[str, Any] = {
        "schema_version": ATIF_VERSION,
        "session_id": session_id or f"{record.get('split', 'rollouts')}-{record.get('id', 0)}",
        "trajectory_id": f"{record.get('split', 'rollouts')}-{record.get('id', 0)}",
        "agent": {"name": agent_name, "version": str(agent_version),
                  **({"model_name": model_name} if model_name else {})},
        "steps": steps,
        "final_metrics": {"total_prompt_tokens": sum(s["metrics"]["prompt_tokens"] for s in steps
                                                     if "metrics" in s) if exact else None,
                          "total_completion_tokens": sum(mask),
                          "total_steps": len(steps)},
        "extra": root_extra}
    if doc["final_metrics"]["total_prompt_tokens"] is None:
        del doc["final_metrics"]["total_prompt_tokens"]
    return doc


def _observe(steps: list[dict[str, Any]], message: Mapping[str, Any]) -> None:
    """Attach a ``tool`` message to the agent step whose call it answers (or a user step)."""
    agent = steps[-1] if steps and steps[-1]["source"] == "agent" else None
    if agent is None:  # a tool result with no call before it: keep it as a user step
        steps.append({"step_id": len(steps) + 1, "source": "user",
                      "message": _text(message.get("content")), "extra": {"role": "tool"}})
        return
    calls = {c["tool_call_id"] for c in agent.get("tool_calls", [])}
    result: dict[str, Any] = {"content": _text(message.get("content"))}
    call_id = message.get("tool_call_id")
    if call_id in calls:
        result["source_call_id"] = call_id
    if message.get("name"):
        result["extra"] = {"name": message["name"]}
    agent.setdefault("observation", {"results": []})["results"].append(result)


def export_run(run_dir: str | os.PathLike[str], out: str | os.PathLike[str], *,
               splits: Sequence[str] | None = None) -> dict[str, int]:
    """Write every kept rollout of ``run_dir`` as ``out/<split>/<id>.json``; count per split.

    ``splits``: only these (default all). The agent's ``model_name`` is the run's
    ``model`` (config.yaml). A record torn by a crash was never indexed, so it is
    not exported.
    """
    from sao_gym.rollout_store import RolloutReader

    reader = RolloutReader(run_dir)
    present = reader.splits()
    wanted = list(splits) if splits else present
    missing = [s for s in wanted if s not in present]
    if missing:
        raise ValueError(f"{run_dir} has no kept rollouts of split(s) {missing}; it has "
                         f"{present or 'none'}")
    model = _run_model(Path(run_dir))
    session = Path(run_dir).resolve().name
    counts = {}
    for split in wanted:
        dest = Path(out) / split
        dest.mkdir(parents=True, exist_ok=True)
        counts[split] = write_trajectories(
            (trajectory(r, model_name=model, session_id=session) for r in reader.records(split)),
            dest)
    return counts


def write_trajectories(docs: Iterable[Mapping[str, Any]], out: str | os.PathLike[str]) -> int:
    """Write each ATIF document to ``out/<trajectory_id>.json``; how many."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for doc in docs:
        path = out / f"{doc['trajectory_id']}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, ensure_ascii=False, indent=1))
        tmp.replace(path)
        n += 1
    return n


def _run_model(run_dir: Path) -> str | None:
    try:
        import yaml

        config = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, ValueError, ImportError):
        return None
    model = config.get("model") if isinstance(config, dict) else None
    return str(model) if model is not None else None
