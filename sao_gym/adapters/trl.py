"""Any registered environment as a TRL ``GRPOTrainer`` environment.

TRL 1.16's ``GRPOTrainer(environment_factory=...)`` takes a zero-argument
factory of objects with ``reset(**dataset_row) -> str | None``; every other
public function of the object's class is a tool, its schema read from the
signature and the Google-style docstring (``transformers.utils.get_json_schema``);
the model's tool calls run as ``tool(**arguments)`` and their results are
``str()``-ed into ``tool`` messages; the episode ends when the model stops
calling tools, and ``reward_funcs`` score the completions.

:func:`environment` builds all three from an env id:

- ``train_dataset``: one row per seed, ``{"prompt": <the env's reset
  messages for that seed, system message included>, "seed": seed}``;
- ``environment_factory``: a class generated for the env, whose only public
  functions are ``reset`` and one typed method per tool of
  ``info["tools"]`` (:func:`~sao_gym.adapters.callables.tool_function`); each
  call is one env step (:class:`~sao_gym.adapters.session.EnvSession`), so the
  env validates the arguments and a bad call is its error message;
- ``reward_funcs``: ``[env_reward]``, the episode's total env reward. A final
  text answer (the last assistant message, when the episode is still going)
  is stepped first, so text-answer envs are scored too. An episode that ended
  in an infra failure (the env raised) scores ``None``, which TRL excludes from
  the group baseline and gives no advantage, instead of a false 0.

Example::

    from trl import GRPOConfig, GRPOTrainer
    from sao_gym.adapters.trl import environment

    env = environment("my_pkg.envs:my/Env-v0", seeds=range(256))
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=env.train_dataset,
                          environment_factory=env.environment_factory,
                          reward_funcs=env.reward_funcs)

TRL parses the model's tool calls with the tokenizer's ``response_template``;
it knows those of a few chat templates, and the tokenizers of
:mod:`sao_gym.models` carry their own (:data:`~sao_gym.models.TOOLS_RESPONSE_TEMPLATE`).
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sao_gym.adapters.callables import function_schema, tool_function
from sao_gym.adapters.session import EnvSession
from sao_gym.registration import require_optional
from sao_gym.types import Message

logger = logging.getLogger(__name__)

RESERVED = ("reset", "get_reward")
"""Method names TRL gives a meaning of its own: no tool may be called so."""

TOOL_TIMEOUT_S = 600.0
"""Default limit of one tool call (a step); past it the episode is an infra failure."""


@dataclass
class TRLEnvironment:
    """What :func:`environment` returns: the three ``GRPOTrainer`` arguments."""

    train_dataset: Any
    """A ``datasets.Dataset`` with ``prompt`` and ``seed`` columns."""
    environment_factory: type
    """The generated environment class (a zero-argument factory)."""
    reward_funcs: list[Callable[..., list[float | None]]]
    """``[env_reward]``: the episode's env reward, ``None`` for an infra failure."""
    tools: list[dict[str, Any]]
    """The env's tool schemas (``info["tools"]`` of the first seed)."""


class SaoGymTRLEnv:
    """Base of the generated classes: one env session, reset per dataset row.

    Subclasses (made by :func:`environment_class`) set the class attributes
    and carry one method per tool. Only ``reset`` and the tools are public,
    since TRL turns every other public function into a tool.
    """

    _env_id: str = ""
    _env_kwargs: dict[str, Any] = {}
    _max_episode_steps: int | None = None
    _tool_timeout_s: float | None = TOOL_TIMEOUT_S
    _tool_names: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._session = EnvSession(self._env_id, max_episode_steps=self._max_episode_steps,
                                   **self._env_kwargs)
        self._warned = False

    def reset(self, seed: int | None = None, prompt: Any = None, **row: Any) -> str | None:
        """Start the episode of a dataset row (its ``seed``); the prompt is the row's.

        A failing env reset does not stop training: the rollout's tools answer
        that the episode is over and it scores ``None`` (excluded).
        """
        try:
            obs, _ = self._session.reset(seed=None if seed is None else int(seed),
                                         options=row.get("options"))
        except Exception as e:  # noqa: BLE001 - an infra failure of this rollout only
            logger.exception("%s: reset(seed=%s) failed; the rollout is excluded",
                             self._env_id, seed)
            return f"Error: the environment failed to start ({type(e).__name__}: {e})"
        names = tuple(t["function"]["name"] for t in self._session.tools)
        if names != self._tool_names and not self._warned:
            self._warned = True
            logger.warning("%s: this episode's tools %s differ from the class's %s",
                           self._env_id, names, self._tool_names)
        if prompt is None:  # a row without its prompt: hand TRL the env's text
            return "\n\n".join(str(m.get("content") or "") for m in obs)
        return None

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        return self._session.call_tool(name, arguments, timeout=self._tool_timeout_s).text

    def _finish(self, completion: Any) -> float | None:
        """Step a final text answer if the episode is still going; the reward (``None``: failed)."""
        session = self._session
        if not session.done:
            last = _last_assistant(completion)
            if last is not None and not last.get("tool_calls"):
                session.send({"role": "assistant", "content": _text(last.get("content"))},
                             timeout=self._tool_timeout_s)
        return None if session.infra_failure or not session.started else session.reward


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _last_assistant(completion: Any) -> Message | None:
    if isinstance(completion, str):
        return {"role": "assistant", "content": completion}
    for message in reversed(list(completion or [])):
        if isinstance(message, dict) and message.get("role") == "assistant":
            return message
    return None


def class_name(env_id: str) -> str:
    """``my_ns/My-Env-v0`` -> ``MyEnvV0``: TRL logs rewards under class names."""
    base = env_id.rsplit(":", 1)[-1].rsplit("/", 1)[-1]
    return "".join(w[:1].upper() + w[1:] for w in re.split(r"[^0-9A-Za-z]+", base) if w) \
        or "SaoGymEnv"


def environment_class(env_id: str, tools: list[dict[str, Any]], *,
                      max_episode_steps: int | None = None,
                      tool_timeout_s: float | None = TOOL_TIMEOUT_S,
                      **env_kwargs: Any) -> type:
    """The TRL environment class of ``env_id`` with one method per schema of ``tools``."""
    namespace: dict[str, Any] = {
        "_env_id": env_id, "_env_kwargs": dict(env_kwargs),
        "_max_episode_steps": max_episode_steps, "_tool_timeout_s": tool_timeout_s,
        "__doc__": f"{env_id} for TRL's GRPOTrainer (made by sao_gym.adapters.trl).",
    }
    names = []
    for schema in tools:
        name = function_schema(schema)["name"]
        if name in RESERVED or name.startswith("_"):
            raise ValueError(f"{env_id}: a tool named {name!r} cannot be a TRL environment "
                             f"method (TRL reserves {RESERVED} and skips names starting with _)")
        if name in namespace:
            raise ValueError(f"{env_id}: two tools are named {name!r}")
        namespace[name] = tool_function(schema, SaoGymTRLEnv._call, method=True)
        names.append(name)
    namespace["_tool_names"] = tuple(names)
    return type(class_name(env_id), (SaoGymTRLEnv,), namespace)


def env_reward(completions: list[Any], environments: list[SaoGymTRLEnv] | None = None,
               **_: Any) -> list[float | None]:
    """TRL reward function: each rollout's total env reward, ``None`` for an infra failure."""
    if environments is None:
        raise ValueError("env_reward needs GRPOTrainer's `environments` (pass the "
                         "environment_factory of sao_gym.adapters.trl.environment)")
    return [env._finish(c) for c, env in zip(completions, environments, strict=True)]


def environment(env_id: str, seeds: Iterable[int], *, max_episode_steps: int | None = None,
                tool_timeout_s: float | None = TOOL_TIMEOUT_S,
                **env_kwargs: Any) -> TRLEnvironment:
    """The dataset, environment factory and reward functions of ``env_id`` (see module docs).

    Each seed's prompt is the env's reset messages for that seed, computed once
    here on one env instance.
    """
    require_optional("trl", needed_by="sao_gym.adapters.trl (the TRL adapter)")
    import datasets  # TRL's own dependency

    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds is empty: give at least one seed")
    probe = EnvSession(env_id, max_episode_steps=max_episode_steps, **env_kwargs)
    rows, tools = [], None
    try:
        for seed in seeds:
            obs, _ = probe.reset(seed=seed)
            rows.append({"prompt": [_prompt_message(m) for m in obs], "seed": seed})
            if tools is None:
                tools = probe.tools
    finally:
        probe.close()
    cls = environment_class(env_id, tools or [], max_episode_steps=max_episode_steps,
                            tool_timeout_s=tool_timeout_s, **env_kwargs)
    return TRLEnvironment(train_dataset=datasets.Dataset.from_list(rows),
                          environment_factory=cls, reward_funcs=[env_reward],
                          tools=copy.deepcopy(tools or []))


def _prompt_message(message: Message) -> dict[str, str]:
    return {"role": str(message.get("role")), "content": _text(message.get("content"))}
