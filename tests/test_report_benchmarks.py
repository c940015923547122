"""The benchmarks' tables render exactly what their raw JSON says (benchmarks/report.py).

Each generator of docs/benchmarks.md reads a file the benchmark script writes
with ``--json`` (benchmarks/_record.py); here each gets a small hand-written one.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import import_benchmark


@pytest.fixture
def report(tmp_path, monkeypatch):
    module = import_benchmark("report")
    monkeypatch.setattr(module, "DATA", tmp_path)
    return module


@pytest.fixture
def data(tmp_path):
    def write(path: str, content: dict) -> None:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(json.dumps(content))

    return write


def rows(table: str) -> list[str]:
    """The table's rows below its header and separator."""
    lines = table.splitlines()
    assert set(lines[1]) <= set("|-")
    return lines[2:]


def test_every_new_generator_is_registered(report):
    assert {"hf_backend_batching", "kv_reuse", "inference_decode", "inference_weight_sync",
            "learner_sao_vs_grpo", "vs_trl_sweep", "vs_trl_finals", "sandbox_local",
            "docker_sandbox", "docker_exec_stress", "async_vs_sync", "sync_reproducible",
            "staleness_bound", "soak", "envs_latency", "vs_trl_tools", "ray_scaling",
            "ray_scaling_light", "ray_learner_threads", "viewer_scale",
            "vs_trl_keychain_wall"} <= set(report.GENERATORS)


def test_hf_backend_batching(report, data):
    data("hf_backend_batching.json", {"settings": {"requests": 16}, "repeats": [
        {"batched_tok_s": 1240.4, "sequential_tok_s": 159.0},
        {"batched_tok_s": 1230.0, "sequential_tok_s": 144.0},
        {"batched_tok_s": 1147.0, "sequential_tok_s": 150.0}]})
    table = report.hf_backend_batching()
    assert table.splitlines()[0].startswith("| repeat | batched (16 concurrent) tok/s |")
    assert rows(table) == ["| 0 | 1240 | 159 | 7.80 |", "| 1 | 1230 | 144 | 8.54 |",
                           "| 2 | 1147 | 150 | 7.65 |",
                           "| **median** | **1230** | **150** | **8.20x** (ratio of medians) |"]


def test_kv_reuse(report, data):
    data("kv_reuse_smollm2.json", {
        "reuse": {"episodes": [{"wall_s": 38.1, "prefill_per_turn": 39.2, "reused_per_turn": 945},
                               {"wall_s": 43.3, "prefill_per_turn": 38.9,
                                "reused_per_turn": 983.4}]},
        "none": {"episodes": [{"wall_s": 101.2, "prefill_per_turn": 986, "reused_per_turn": 0},
                              {"wall_s": 93.6, "prefill_per_turn": 1013.2,
                               "reused_per_turn": 0}]}})
    assert rows(report.kv_reuse()) == [
        "| 0 | 38.1 s, 39 prefilled per turn (945 reused) | 101.2 s, 986 per turn | 2.66x |",
        "| 1 | 43.3 s, 39 prefilled per turn (983 reused) | 93.6 s, 1,013 per turn | 2.16x |",
        "| median | 40.7 s | 97.4 s | **2.39x** |"]


def test_inference_tables(report, data):
    data("inference.json", {"concurrency": [1, 64], "models": {
        "tiny": {"params": 620_000, "fp32_mb": 2.4,
                 "hf": {"1": {"hf": 371.2}, "64": {"hf": 5387.0}, "update_s": 0.0041},
                 "sao": {"1": {"backend": 345.0}, "64": {"backend": 6163.4},
                         "update_s": 0.0302, "publish_s": 0.0043}},
        "smollm2": {"params": 134_515_008, "fp32_mb": 513.1,
                    "hf": {"1": {"hf": 12.4}, "64": {"hf": 85.0}, "update_s": 0.0701},
                    "sao": {"1": {"backend": 11.0}, "64": {"backend": 93.0},
                            "update_s": 1.1424, "publish_s": 0.528},
                    "vllm": {"1": {"backend": 14.2}, "64": {"backend": 125.0},
                             "update_s": 1.8936, "publish_s": 1.5851}}}})
    assert rows(report.inference_decode()) == [
        "| tiny (0.6M) | 1 | 371 | 345 | - |", "| tiny (0.6M) | 64 | 5,387 | 6,163 | - |",
        "| smollm2 (134.5M) | 1 | 12 | 11 | 14 |", "| smollm2 (134.5M) | 64 | 85 | 93 | 125 |"]
    assert rows(report.inference_weight_sync()) == [
        "| tiny (2 MB) | 4 ms | 30 ms (4 ms) | - |",
        "| smollm2 (513 MB) | 70 ms | 1,142 ms (528 ms) | 1,894 ms (1,585 ms) |"]


def test_learner_sao_vs_grpo(report, data):
    data("learner_sao_vs_grpo/threads2.json", {"tokens": 8192, "times_s": {
        "grpo": [2.0, 2.4, 2.2], "grpo_dis": [2.6, 2.5, 2.7], "sao": [6.6, 7.0, 6.8],
        "sao bf16": [20.0, 22.0, 21.0]}})
    data("learner_sao_vs_grpo/threads1.json", {"tokens": 8192, "times_s": {
        "grpo": [4.0, 4.2, 4.1], "grpo_dis": [4.4, 4.4, 4.4], "sao": [12.3, 12.1, 12.2]}})
    assert rows(report.learner_sao_vs_grpo()) == [
        "| `grpo` (PPO clip) | 2.200 s | 3724 | 1.00 | 0.85 | 4.100 s | 1.00 |",
        "| `grpo_dis` | 2.600 s | 3151 | 1.18 | 1.00 | 4.400 s | 1.07 |",
        "| `sao` (K = 2 updates of the full-size critic + policy) | 6.800 s | 1205 | 3.09 | "
        "2.62 | 12.200 s | 2.98 |",
        "| `sao bf16` | 21.000 s | 390 | 9.55 | 8.08 | - | - |"]


def test_sandbox_local(report, data):
    for run, (floor, true, python, start) in enumerate([(1.80, 10.39, 27.55, 88.4),
                                                        (1.92, 11.41, 28.12, 91.5),
                                                        (1.89, 11.75, 28.73, 95.9)]):
        data(f"sandbox/run{run}.json", {"summary": {
            "floor: spawn true": {"median_ms": floor}, "local true": {"median_ms": true},
            "local python": {"median_ms": python}, "local start+close": {"median_ms": start}}})
    assert rows(report.sandbox_local()) == [
        "| 0 | 1.80 ms | 10.39 ms | 27.55 ms | 88.4 ms |",
        "| 1 | 1.92 ms | 11.41 ms | 28.12 ms | 91.5 ms |",
        "| 2 | 1.89 ms | 11.75 ms | 28.73 ms | 95.9 ms |",
        "| median | 1.89 ms | 11.41 ms | 28.12 ms | 91.5 ms |"]


def test_docker_sandbox(report, data):
    data("docker_sandbox.json", {"execs": 50, "rows_s": [
        {"warm exec": 0.0814, "cold start": 0.342, "file round trip": 0.178, "close": 0.108},
        {"warm exec": 0.0770, "cold start": 0.324, "file round trip": 0.192, "close": 0.088}]})
    table = report.docker_sandbox()
    assert "warm exec (median of 50)" in table.splitlines()[0]
    assert rows(table) == ["| 0 | 81.4 ms | 342 ms | 178 ms | 108 ms |",
                           "| 1 | 77.0 ms | 324 ms | 192 ms | 88 ms |",
                           "| median | 79.2 ms | 333 ms | 185 ms | 98 ms |"]


def test_docker_exec_stress(report, data):
    data("docker_exec_stress/after.json", {
        "per_trial": [0, 0], "wrong": 0, "commands": 480, "trials": [{"wrong": []}] * 2,
        "provenance": {"commit": "90a9c5e66197"}})
    data("docker_exec_stress/before.json", {
        "per_trial": [2, 1], "wrong": 3, "commands": 480, "provenance": {"commit": "1c1693a"},
        "trials": [{"wrong": ["exit 0, stdout ''", "exit 0, stdout ''"]},
                   {"wrong": ["SandboxUnavailable: a | b"]}]})
    assert rows(report.docker_exec_stress()) == [
        "| before (1c1693a) | 2, 1 | **3 of 480** | 2 x exit 0, stdout ''; "
        "1 x SandboxUnavailable: a \\| b |",
        "| after (90a9c5e66197) | 0, 0 | **0 of 480** | - |"]


def test_async_vs_sync(report, data):
    data("async_vs_sync.json", {"runs": {"async": [2.19, 2.07, 2.21], "sync": [0.65, 0.67, 0.65]},
                                "async_trajectories_per_s": 2.19,
                                "sync_trajectories_per_s": 0.65, "ratio": 3.3692})
    table = report.async_vs_sync()
    assert table.splitlines()[0] == "| mode | trajectories/s (median of 3) | runs |"
    assert rows(table) == ["| async | 2.19 | 2.19, 2.07, 2.21 |",
                           "| sync | 0.65 | 0.65, 0.67, 0.65 |", "| **ratio** | **3.37x** | |"]


def test_sync_reproducible(report, data):
    row = {"tensors": 175, "differ_a_b": 0, "metrics_equal_a_b": True, "differ_a_batched": 121,
           "steps_per_s": {"a": 0.0261, "b": 0.0243, "batched": 0.0661},
           "batched_over_invariant": 2.6312}
    data("sync_reproducible/heavytail.json", {
        "config": ["mode=sync", "seed=3", "env=sao_gym/HeavyTail-v0"], "rounds": [row]})
    data("sync_reproducible/demo.json", {"config": ["mode=sync", "seed=0"], "rounds": [
        {**row, "differ_a_b": 2, "metrics_equal_a_b": False,
         "steps_per_s": {"a": 0.5712, "b": 0.5698, "batched": 1.1234},
         "batched_over_invariant": 1.9685}]})
    assert rows(report.sync_reproducible()) == [
        "| demo recipe (0) | 2 of 175 | no | 121 of 175 | 0.571, 0.57 | 1.12 | 1.97x |",
        "| sao_gym/HeavyTail-v0 (3) | 0 of 175 | yes | 121 of 175 | 0.0261, 0.0243 | 0.0661 "
        "| 2.63x |"]


def test_staleness_bound(report, data):
    data("staleness_bound.json", {"runs": [
        {"bound": 1, "lines": 40, "staleness_max": 1.0, "lines_at_bound": 39,
         "lines_over_bound": 0, "staleness_mean": 0.7412, "loop_s": 248.3},
        {"bound": 2, "lines": 40, "staleness_max": 2.0, "lines_at_bound": 38,
         "lines_over_bound": 0, "staleness_mean": 1.4834, "loop_s": 180.6}]})
    assert rows(report.staleness_bound()) == ["| 1 | 40 | 1 | 39 | 0 | 0.74 | 248 s |",
                                              "| 2 | 40 | 2 | 38 | 0 | 1.48 | 181 s |"]


def test_soak(report, data):
    data("soak.json", {"steps": 1000, "loop_seconds": 444.2, "rss_mb_step_100": 391.5,
                       "rss_mb_end": 398.4, "rss_mb_max_after_100": 409.1,
                       "rss_growth_after_100": 0.045, "nonfinite_values": 0})
    table = report.soak()
    assert "| at step 1000 |" in table.splitlines()[0]
    assert rows(table) == ["| trainer | 391.5 MB | 409.1 MB | 398.4 MB | +4.5% | 0 | 7.4 min |"]


def test_envs_latency(report, data):
    data("envs_local.json", {"envs": {
        "Arithmetic": {"episodes": 32, "concurrency": 32, "episodes_per_s": 1670.3,
                       "solved_rate": 1.0, "reset": {"median_ms": 0.2}, "step": {
                           "median_ms": 0.1, "p95_ms": 0.2}, "calculator": {"median_ms": 0.1},
                       "submit": {"median_ms": 0.1}, "times_ms": {"step": [0.1, 0.2]}},
        "CoqProof": {"episodes": 32, "concurrency": 32, "episodes_per_s": 2.45,
                     "solved_rate": 0.96875, "reset": {"median_ms": 0.5},
                     "step": {"median_ms": 3192.0, "p95_ms": 9593.4},
                     "check_proof": {"median_ms": 4591.2}}}})
    table = report.envs_latency()
    assert "episodes/s (32 at once)" in table.splitlines()[0]
    assert rows(table) == [
        "| Arithmetic | 1670 | 0.1 ms | 0.2 ms | 0.2 ms | calculator 0.1 ms, submit 0.1 ms | "
        "32/32 |",
        "| CoqProof | 2.45 | 3192 ms | 9593 ms | 0.5 ms | check_proof 4591 ms | 31/32 |"]


def _ray(seed: int, ray: dict[str, list[float]], threads=None) -> dict:
    med = {k: sorted(v)[len(v) // 2] for k, v in ray.items()}
    return {"trajectories_per_s": med, "runs": ray, "episodes_per_worker": 8,
            "speedup_1_to_2": med["ray_2"] / med["ray_1"],
            "ray_overhead_vs_local": 1 - med["ray_2"] / med["local_equal_to_ray_2"],
            "settings": {"workers": [1, 2], "seed": seed, "learner_threads": threads}}


def test_ray_tables(report, data):
    data("ray_scaling/seed0.json", _ray(0, {"ray_1": [3.10, 3.05, 3.13],
                                            "ray_2": [5.94, 6.04, 6.05],
                                            "local_equal_to_ray_2": [5.78, 6.13, 6.04]}))
    data("ray_scaling/seed1.json", _ray(1, {"ray_1": [3.11], "ray_2": [6.03],
                                            "local_equal_to_ray_2": [6.16]}))
    table = report.ray_scaling()
    assert table.splitlines()[0] == ("| run | seed 0: trajectories/s (runs) | vs 1 worker | "
                                     "seed 1: trajectories/s (runs) | vs 1 worker |")
    assert rows(table) == [
        "| Ray, 1 worker (8 episodes) | 3.10 (3.10, 3.05, 3.13) | 1.00x | 3.11 (3.11) | 1.00x |",
        "| Ray, 2 workers (16 episodes) | 6.04 (5.94, 6.04, 6.05) | 1.95x | 6.03 (6.03) | "
        "1.94x |",
        "| one process, 16 episodes | 6.04 (5.78, 6.13, 6.04) |  | 6.16 (6.16) |  |",
        "| **Ray overhead at 16 episodes** | **0.0%** |  | **2.1%** |  |"]
    data("ray_scaling/light.json", _ray(2, {"ray_1": [3.40], "ray_2": [6.31],
                                            "local_equal_to_ray_2": [6.59]}))
    assert rows(report.ray_scaling_light())[-1] == (
        "| **Ray overhead at 16 episodes** | **4.2%** |  |")
    for threads, ray4 in ((None, [10.44, 10.44]), (2, [10.47, 8.78])):
        name = f"learner_threads{threads or 1}.json"
        data(f"ray_scaling/{name}", _ray(0, {"ray_1": [3.22], "ray_2": [6.34], "ray_4": ray4,
                                             "local_equal_to_ray_2": [6.35]}, threads))
    assert rows(report.ray_learner_threads()) == [
        "| default | 3.22 | 6.34 | 10.44 (10.44, 10.44) | 6.35 | 1.97x | 0.2% |",
        "| 2 | 3.22 | 6.34 | 10.47 (10.47, 8.78) | 6.35 | 1.97x | 0.2% |"]


def test_viewer_scale(report, data):
    data("viewer_scale.json", {
        "settings": {"rollouts": 100_000, "repeats": 3, "long_tokens": 4000},
        "times_s": {"api_first_page_cold_s": [0.44, 0.33, 0.47],
                    "api_long_episode_s": [0.026, 0.002, 0.04]}})
    table = report.viewer_scale()
    assert table.splitlines()[0] == "| what (100,000 rollouts) | median of 3 [min, max] |"
    assert rows(table) == [
        "| API: first page, first request to a fresh server (reads the index) | 0.440 s "
        "[0.330, 0.470] |",
        "| API: the 4,000-token record | 0.026 s [0.002, 0.040] |"]


def test_vs_trl_tools(report, data):
    side = {"trajectories": 192, "steps": 12, "wall_s": 191.0, "trajectories_per_s": 1.004,
            "tokens_per_s": 43.2, "tool_calls_per_trajectory": 1.852, "mean_reward": 0.0208,
            "peak_rss_mb": 987.4}
    data("vs_trl_tools/results.json", {
        "trl": {**side, "tools_s": 172.1, "generate_s": 8.4},
        "sao": {**side, "wall_s": 31.0, "trajectories_per_s": 6.19, "tool_delay_s": 179.4,
                "update_s": 27.2},
        "runs": {"trl": [{"trajectories_per_s": 1.18}, {"trajectories_per_s": 0.97}],
                 "sao": [{"trajectories_per_s": 6.21}, {"trajectories_per_s": 6.19}]},
        "ratio": 6.159})
    table = report.vs_trl_tools()
    assert table.splitlines()[0] == "| (median of 2 runs) | TRL GRPOTrainer | sao-gym train (SAO) |"
    assert rows(table) == [
        "| trajectories | 192 | 192 |", "| learner steps | 12 | 12 |",
        "| training wall time (s) | 191.0 | 31.0 |", "| **trajectories/s** | **1.00** | **6.19** |",
        "| generated tokens/s | 43 | 43 |", "| tool calls / trajectory | 1.85 | 1.85 |",
        "| mean reward | 0.021 | 0.021 |", "| peak RSS (MB) | 987 | 987 |",
        "| trajectories/s of each run | 1.18, 0.97 | 6.21, 6.19 |",
        "| time inside tool calls (s) | 172.1 (sequential, 90% of wall) | 179.4 summed over all "
        "episodes (concurrent) |",
        "| time inside generate / learner updates (s) | generate 8.4 (4%), the rest 10.5 | "
        "learner updates 27.2 (88%; sampling runs alongside) |",
        "| SAO / TRL trajectories/s | | **6.16x** |"]


def _vs_trl_run(side: str, lr: float, steps: int, rate: float, after: float) -> dict:
    return {"side": side, "lr": lr, "steps": steps, "completions_per_s": rate,
            "tokens_per_s": 10.85 * rate, "peak_rss_mb": 1160.2, "accuracy_before": 0.245,
            "accuracy_after": after, "gain_points": round(100 * (after - 0.245), 2),
            "train_rewards_first_last": [0.4712, 0.6149]}


def test_vs_trl_sweep_and_finals(report, data):
    data("vs_trl_wd/results.json", {
        "settings": {"final_seed": 0},
        "trl": _vs_trl_run("trl", 5e-5, 401, 42.76, 0.44),
        "sao": _vs_trl_run("sao", 1e-4, 295, 31.47, 0.56),
        "sweep": [_vs_trl_run("trl", 2e-5, 126, 44.46, 0.30),
                  _vs_trl_run("trl", 5e-5, 130, 46.21, 0.32),
                  _vs_trl_run("sao", 1e-4, 78, 27.47, 0.315)]})
    data("vs_trl_wd/results-seed1.json", {
        "settings": {"final_seed": 1}, "sweep": [],
        "trl": _vs_trl_run("trl", 5e-5, 430, 45.80, 0.44),
        "sao": _vs_trl_run("sao", 1e-4, 292, 31.14, 0.575)})
    assert rows(report.vs_trl_sweep()) == ["| 2e-5 | 126, 44.46, 30.0% | - |",
                                           "| 5e-5 | 130, 46.21, 32.0% | - |",
                                           "| 1e-4 | - | 78, 27.47, 31.5% |"]
    finals = report.vs_trl_finals()
    assert finals.splitlines()[0] == ("| | TRL GRPOTrainer (lr 5e-5) | sao-gym train, SAO "
                                      "(lr 1e-4) |")
    assert rows(finals) == [
        "| learner steps (seed 0) | 401 | 295 |",
        "| completions/s (seed 0) | 42.76 | 31.47 (**0.74x**) |",
        "| generated tokens/s (seed 0) | 463.9 | 341.4 |",
        "| peak RSS of the training process (seed 0) | 1,160 MB | 1,160 MB |",
        "| training reward, first -> last 5 logged steps (seed 0) | 0.47 -> 0.61 | 0.47 -> 0.61 |",
        "| greedy held-out accuracy (seed 0) | 24.5% -> 44.0% (**+19.5**) | 24.5% -> 56.0% "
        "(**+31.5**) |",
        "| learner steps (seed 1) | 430 | 292 |",
        "| completions/s (seed 1) | 45.80 | 31.14 (**0.68x**) |",
        "| generated tokens/s (seed 1) | 496.9 | 337.9 |",
        "| peak RSS of the training process (seed 1) | 1,160 MB | 1,160 MB |",
        "| training reward, first -> last 5 logged steps (seed 1) | 0.47 -> 0.61 | 0.47 -> 0.61 |",
        "| greedy held-out accuracy (seed 1) | 24.5% -> 44.0% (**+19.5**) | 24.5% -> 57.5% "
        "(**+33.0**) |"]


def test_vs_trl_keychain_wall_gives_the_docs_table_from_its_kept_data():
    report = import_benchmark("report")
    doc = (report.ROOT / "docs" / "benchmarks.md").read_text()
    assert report.vs_trl_keychain_wall() + "\n" in doc
    assert rows(report.vs_trl_keychain_wall())[1] == (
        "| 1 | 3,200 in 1,850 s: 1.73 | 5,360 in 1,854 s: 2.89 | 1.67x | 4.12 |")
