"""The algorithms the learner implements, as records chosen once by name.

Each :class:`Algorithm` says how advantages are estimated and which policy
loss is used; the learner reads the record once at construction instead of
checking names in its step. Torch-free, so configs validate without it.

=================  =========================================  ==================
algorithm          advantages                                 policy loss
=================  =========================================  ==================
``sao``            critic + skip-observation GAE              DIS (sampler logprobs)
``vapo``           critic + skip-observation GAE              PPO clip (old policy)
``grpo``           group-normalised rewards (G per task)      PPO clip (old policy)
``grpo_dis``       group-normalised rewards (G per task)      DIS (sampler logprobs)
``running_mean``   reward minus a running-mean baseline       DIS (sampler logprobs)
=================  =========================================  ==================

>>> ALGORITHMS["grpo"].grouped, ALGORITHMS["sao"].critic
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    """What one algorithm is made of."""

    name: str
    """Its name in configs."""
    critic: bool
    """Advantages from a value model (skip-observation GAE)."""
    dis: bool
    """DIS policy loss against the sampler's logprobs (else PPO clip against a
    recomputed old policy)."""
    grouped: bool = False
    """Advantages normalised within groups of rollouts of one task (GRPO)."""
    running_mean: bool = False
    """Advantages against a running mean of past rewards."""


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a for a in (
        Algorithm("sao", critic=True, dis=True),
        Algorithm("vapo", critic=True, dis=False),
        Algorithm("grpo", critic=False, dis=False, grouped=True),
        Algorithm("grpo_dis", critic=False, dis=True, grouped=True),
        Algorithm("running_mean", critic=False, dis=True, running_mean=True),
    )
}
"""Every algorithm by name."""
