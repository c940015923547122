"""Play random-agent episodes on every registered environment and print a summary.

Run: python examples/random_agent.py
"""

import asyncio

import sao_gym
from sao_gym.agents import RandomAgent
from sao_gym.evaluation import EpisodeSummary, run_episodes


async def main() -> None:
    for env_id in sao_gym.env_ids():
        rollouts = await run_episodes(lambda env_id=env_id: sao_gym.make(env_id),
                                      lambda: RandomAgent(seed=0), episodes=8, concurrency=8)
        print(env_id, EpisodeSummary.of(rollouts))


if __name__ == "__main__":
    asyncio.run(main())
