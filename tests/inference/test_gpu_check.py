"""Smoke test of benchmarks/gpu_check.py on the CPU (tiny model)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import import_benchmark


@pytest.mark.slow
def test_gpu_check_cpu(tmp_path):
    gpu_check = import_benchmark("gpu_check")
    out = tmp_path / "g.json"
    assert gpu_check.main(["--device", "cpu", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["size"] == "tiny" and res["errors"] == {}
    for c in ("1", "8", "64"):
        assert res["hf_decode"][c]["tokens_per_s"] > 0
        assert res["hf_decode"][c]["tokens"] == int(c) * res["new_tokens"]
    assert res["logprob_agreement"]["tokens"] == 8 * res["new_tokens"]
    assert res["logprob_agreement"]["max_abs_diff"] < 1e-3  # float32 on cpu
    assert res["learner_logprob_agreement"]["max_abs_diff"] < 1e-3
    assert res["learner"]["device"] == "cpu" and res["learner"]["tokens_per_s"] > 0
    scale = res["learner_scale"]
    assert set(scale["rows"]) == {"full", "lora", "ckpt", "fsdp1"}
    assert all(scale["checks"].values()), scale["checks"]
    assert scale["rows"]["lora"]["trainable"] * 10 < scale["rows"]["full"]["trainable"]
    upd = res["weight_update"]
    assert upd["median_seconds"] > 0
    assert upd["rounds"][0]["versions_seen"] == [0, 1]
    assert upd["rounds"][0]["generations_with_both"] > 0
    assert res["vllm"] in ("not installed", "skipped on cpu")
