"""The in-process transformers backend.

- :mod:`~sao_gym.inference.hf.backend`: :class:`HFBackend`, continuous
  batching of many episodes' requests on one model;
- :mod:`~sao_gym.inference.hf.batch`: the decoding batch (its KV cache, rows
  joining and leaving between steps);
- :mod:`~sao_gym.inference.hf.sessions`: per-episode KV kept between turns,
  so a turn prefills only its new tokens.
"""

from sao_gym.inference.hf.backend import BackendStats, HFBackend

__all__ = ["BackendStats", "HFBackend"]
