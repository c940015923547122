"""Algorithms as records of functions: how advantages are estimated, which loss trains.

An :class:`Algorithm` is data the learner reads, never a name it checks: its
advantage estimator and its policy loss are functions on the record, with
the loss's band (or clip) widths as the record's defaults; whether it trains
a critic, whether rollouts come in groups, and what the policy loss's
ratio is taken against are fields.

=================  =========================================  ==================
algorithm          advantages                                 policy loss
=================  =========================================  ==================
``sao``            critic + skip-observation GAE              DIS (sampler logprobs)
``vapo``           critic + skip-observation GAE              PPO clip (old policy)
``grpo``           group-normalised rewards (G per task)      PPO clip (old policy)
``grpo_dis``       group-normalised rewards (G per task)      DIS (sampler logprobs)
``running_mean``   reward minus a running-mean baseline       DIS (sampler logprobs)
=================  =========================================  ==================

An algorithm of your own is a record in your module;
``--set algorithm=my_module:REINFORCE`` (or ``find_algorithm``) imports the
module and uses it. docs/learner.md, "Add an algorithm", has an example.

>>> ALGORITHMS["grpo"].grouped, ALGORITHMS["sao"].critic, ALGORITHMS["vapo"].eps
(True, True, (0.2, 0.28))
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sao_gym.learner import estimators, losses

REFERENCES = ("sampler", "old_policy")
"""What a policy loss's ratio is taken against: the sampler's recorded logprobs,
or the policy at the start of the learner step (recomputed, PPO's old policy)."""


@dataclass(frozen=True)
class Algorithm:
    """What one algorithm is made of (module docs).

    ``advantages(batch)`` gets an :class:`~sao_gym.learner.estimators.AdvantageBatch`
    (the rollouts, their micro-batches, the critic's values when the
    algorithm has one, the config, the algorithm's ``state``) and returns
    per-micro-batch ``[B, T]`` advantages, 0 off action tokens.
    ``policy_loss(logprobs, reference, advantages, mask, *, eps_low, eps_high,
    aggregation, num_tokens, num_seqs) -> (loss, stats)`` is a pure loss of
    :mod:`sao_gym.learner.losses`' shape.
    """

    name: str
    """Its name (in configs, checkpoints and errors)."""
    advantages: Callable[[Any], list[Any]]
    """The advantage estimator."""
    policy_loss: Callable[..., tuple[Any, dict[str, Any]]]
    """The policy loss."""
    eps: tuple[float, float]
    """``(eps_low, eps_high)`` of ``policy_loss`` unless ``learner.eps_low/eps_high`` set them."""
    reference: str = "sampler"
    """The ratio's denominator: ``"sampler"`` or ``"old_policy"`` (:data:`REFERENCES`)."""
    critic: bool = False
    """Trains a value model; ``advantages`` then gets its values."""
    grouped: bool = False
    """Rollouts come in groups of ``rollout.group_size`` of one task (GRPO)."""
    state: Callable[[Any], Any] | None = None
    """Builds the algorithm's own state from the learner config (e.g. a running-mean
    baseline; saved in checkpoints through its ``state_dict``/``load_state_dict``)."""

    def __post_init__(self) -> None:
        if self.reference not in REFERENCES:
            raise ValueError(f"algorithm {self.name!r}: reference must be one of {REFERENCES}, "
                             f"got {self.reference!r}")
        if len(self.eps) != 2 or not all(e > 0 for e in self.eps):
            raise ValueError(f"algorithm {self.name!r}: eps must be two widths > 0, got "
                             f"{self.eps!r}")


DIS_EPS = (0.3, 5.0)
"""DIS's band (PAPER.md 5): a token trains while ``0.7 < ratio < 6``."""
PPO_EPS = (0.2, 0.28)
"""PPO clip-higher (DAPO's asymmetric clip)."""

ALGORITHMS: dict[str, Algorithm] = {
    a.name: a for a in (
        Algorithm("sao", estimators.gae_advantages, losses.dis_policy_loss, DIS_EPS,
                  critic=True),
        Algorithm("vapo", estimators.gae_advantages, losses.ppo_clip_policy_loss, PPO_EPS,
                  reference="old_policy", critic=True),
        Algorithm("grpo", estimators.group_advantages, losses.ppo_clip_policy_loss, PPO_EPS,
                  reference="old_policy", grouped=True),
        Algorithm("grpo_dis", estimators.group_advantages, losses.dis_policy_loss, DIS_EPS,
                  grouped=True),
        Algorithm("running_mean", estimators.running_mean_advantages, losses.dis_policy_loss,
                  DIS_EPS, state=estimators.running_mean_baseline),
    )
}
"""The built-in algorithms by name."""


def find_algorithm(name: str | Algorithm) -> Algorithm:
    """The :class:`Algorithm` named ``name``: a built-in, or ``module:NAME`` (imported).

    Raises ``ValueError`` (one line) for an unknown name, a module that does not
    import, or an attribute that is not an :class:`Algorithm`.
    """
    if isinstance(name, Algorithm):
        return name
    if not isinstance(name, str) or not name:
        raise ValueError(f"algorithm must be a name, got {name!r}")
    if ":" not in name:
        if name not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {name!r}; choose one of {tuple(ALGORITHMS)} "
                             "or MODULE:NAME for an Algorithm record of your own")
        return ALGORITHMS[name]
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"algorithm {name!r}: cannot import {module_name!r}: {e}") from None
    record = getattr(module, attr, None)
    if not isinstance(record, Algorithm):
        raise ValueError(f"algorithm {name!r}: {module_name}.{attr} is "
                         f"{'missing' if record is None else type(record).__name__}, not a "
                         "sao_gym.learner.algorithms.Algorithm record")
    return record


__all__ = ["ALGORITHMS", "Algorithm", "DIS_EPS", "PPO_EPS", "REFERENCES", "find_algorithm"]
