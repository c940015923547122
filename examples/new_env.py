"""An environment with its oracle in under 65 lines: find a secret number, told "higher"/"lower".

``python examples/new_env.py`` checks it, then plays one scripted episode (docs/new_env.md)."""

import json

import sao_gym
from sao_gym.tools import ToolEnv, ToolResult, tool


class GuessNumberEnv(ToolEnv):
    """Guess an integer in [1, high]; each wrong guess is answered "higher" or "lower"."""

    def __init__(self, high: int = 100):
        super().__init__()
        if not isinstance(high, int) or high < 2:
            raise ValueError(f"high must be an int >= 2, got {high!r}")
        self.high = high

    async def on_reset(self, options):
        secret = int(options.get("secret", self.np_random.integers(1, self.high + 1)))
        prompt = f"I picked an integer in [1, {self.high}]. Find it with the guess tool."
        task_id = f"guess-{self.np_random.integers(10**9)}"  # never the secret: clients see ids
        self.task = {"id": task_id, "prompt": prompt, "answer": secret, "high": self.high}
        return [{"role": "user", "content": prompt}], {}

    @tool(description="Guess the number.", parameters={
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
        "additionalProperties": False})
    async def guess(self, n: int):
        if n == self.task["answer"]:
            return ToolResult("correct", terminated=True, reward=1.0)
        return "higher" if n < self.task["answer"] else "lower"


def oracle(messages, task):
    """Binary search: guess the middle of what the answers so far leave open."""
    low, high, last = 1, task["high"], None
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            last = int(json.loads(m["tool_calls"][0]["function"]["arguments"])["n"])
        elif m.get("role") == "tool" and last is not None:
            low, high = (last + 1, high) if m["content"] == "higher" else (low, last - 1)
    return f"guess({(low + high) // 2})"


sao_gym.register("examples/GuessNumber-v0", GuessNumberEnv, max_episode_steps=10, oracle=oracle)


if __name__ == "__main__":
    import asyncio

    from sao_gym.agents import ScriptedAgent
    from sao_gym.utils.env_checker import check_agent_env

    print("checks passed:", ", ".join(check_agent_env(sao_gym.make("examples/GuessNumber-v0"))))
    guesses = [{"role": "assistant", "content": None, "tool_calls": [{
        "id": "c", "type": "function", "function": {"name": "guess", "arguments": f'{{"n": {n}}}'},
    }]} for n in (50, 25, 37)]
    env = sao_gym.make("examples/GuessNumber-v0")
    rollout = asyncio.run(sao_gym.run_episode(env, ScriptedAgent(guesses), options={"secret": 37}))
    print(f"reward {rollout.reward} after {rollout.metrics['turns']:.0f} turns")
