"""Built-in environments (installed as ``sao_gym.envs``), one folder each."""
