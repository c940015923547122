"""benchmarks/vs_trl_tools.py end to end in its smoke mode (numbers meaningless)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import import_benchmark

pytest.importorskip("trl", reason="the `trl` extra is not installed")


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("vs_trl_tools")


async def test_tool_calls_wait_a_seeded_lognormal_delay(bench):
    env = bench.SlowArithmeticEnv(latency_median_s=0.01, latency_sigma=0.5, max_latency_s=0.05)
    call = {"role": "assistant", "content": None, "tool_calls": [{
        "id": "c", "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps({"expression": "1 + 2"})}}]}
    slept = []
    for _ in range(2):
        obs, info = await env.areset(seed=7)
        before = dict(bench.LATENCY)
        observation, *_ = await env.astep(call)
        assert observation[0]["content"] == "3"
        assert bench.LATENCY["calls"] == before["calls"] + 1  # one delay per call
        slept.append(bench.LATENCY["seconds"] - before["seconds"])
    assert slept[0] == slept[1]  # fixed by the seed
    assert 0 < slept[0] <= 0.05
    await env.areset(seed=8)
    assert env.next_delay() != slept[0]
    assert all("additionalProperties" not in t["function"]["parameters"] for t in info["tools"])
    await env.aclose()


@pytest.mark.slow
def test_smoke_run_reports_both_sides(bench, tmp_path):
    results = bench.main(["--out", str(tmp_path), "--smoke", "--threads", "1"])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["ratio"] == results["ratio"]
    trl, sao = saved["trl"], saved["sao"]
    assert trl["trajectories"] == sao["trajectories"] == bench.SMOKE["trajectories"]
    assert trl["trajectories_per_s"] > 0 and sao["trajectories_per_s"] > 0
    assert trl["steps"] == sao["steps"] == bench.SMOKE["trajectories"] // bench.SMOKE["batch"]
    assert saved["warm_start"]["prompts_identical"]
    assert "trajectories/s" in (tmp_path / "table.md").read_text()
