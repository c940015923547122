import time

import pytest

from sao_gym.envs.latency import HeavyTailEnv


def test_lengths_are_seeded_heavy_tailed_and_capped():
    env = HeavyTailEnv(latency_median_s=0.0, turns_median=3, turns_sigma=1.0, max_turns=12)
    lengths = []
    for seed in range(300):
        env.reset(seed=seed)
        lengths.append(env.task["turns"])
    env.reset(seed=7)
    again = env.task["turns"]
    assert again == lengths[7]
    assert min(lengths) >= 1 and max(lengths) == 12
    assert sorted(lengths)[150] in (2, 3, 4)  # median near 3
    assert sum(x >= 8 for x in lengths) >= 10  # a real tail


def test_episode_runs_its_length_with_bounded_latency():
    env = HeavyTailEnv(latency_median_s=0.01, latency_sigma=2.0, max_latency_s=0.05)
    env.reset(seed=1)
    n = env.task["turns"]
    start = time.monotonic()
    for i in range(n):
        obs, reward, term, trunc, _ = env.step("ab" if i == n - 1 else "x")
    assert term and not trunc and reward == 1.0 and obs[0]["content"] == "done"
    assert time.monotonic() - start < 0.06 * n + 0.5
    with pytest.raises(ValueError):
        HeavyTailEnv(turns_median=0.5)
