"""Built-in environments (installed as ``sao_gym.envs``), one folder each.

Importing this package registers them (``import sao_gym`` does) with their
training hooks; nothing heavy is imported until an environment is made or an
oracle is used (lazy ``"module:name"`` references).
"""

from sao_gym.registration import register

register(
    "sao_gym/Arithmetic-v0",
    "sao_gym.envs.arithmetic:ArithmeticEnv",
    max_episode_steps=8,
    oracle="sao_gym.envs.arithmetic.oracle:arithmetic_oracle",
)
register(
    "sao_gym/KeyChain-v0",
    "sao_gym.envs.key_chain:KeyChainEnv",
    oracle="sao_gym.envs.key_chain.oracle:key_chain_oracle",
    difficulty={"hops": [4, 8, 16, 32, 64, 128, 256]},
)
register(
    "sao_gym/MathTIR-v0",
    "sao_gym.envs.math_tir:MathTIREnv",
    max_episode_steps=16,
    oracle="sao_gym.envs.math_tir.oracle:arithmetic_tool_oracle",
)
register(
    "sao_gym/CoqProof-v0",
    "sao_gym.envs.coq_proof:CoqProofEnv",
    max_episode_steps=20,
    hooks={"harbor": "sao_gym.envs.coq_proof.harbor:export_task"},
)
register(
    "sao_gym/HeavyTail-v0",
    "sao_gym.envs.latency:HeavyTailEnv",
    max_episode_steps=16,
)
register(
    "sao_gym/CodeRepo-v0",
    "sao_gym.envs.code_repo:CodeRepoEnv",
    max_episode_steps=50,
    hooks={"harbor": "sao_gym.envs.code_repo.harbor:export_task",
           "tasks_cli": "sao_gym.envs.code_repo.cli:add_parser"},
)
register(
    "sao_gym/OpenEnv-v0",
    "sao_gym.adapters.openenv:OpenEnvAgentEnv",
)
register(
    "sao_gym/HarborTask-v0",
    "sao_gym.adapters.harbor:HarborTaskEnv",
    max_episode_steps=50,
)
