"""Freed host memory goes back to the OS (glibc's malloc_trim) in the CPU engines."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from sao_gym.learner.engine import host_memory
from sao_gym.learner.engine.local import LocalEngine

needs_glibc = pytest.mark.skipif(host_memory._malloc_trim() is None,
                                 reason="the C library has no malloc_trim")

# In a fresh process: blocks of 2 MB live in glibc's heap once a freed 8 MB
# mmapped block has raised the mmap threshold; after they are freed the heap
# keeps them resident until malloc_trim returns them.
CHILD = textwrap.dedent("""
    import json, os, sys
    import torch
    from sao_gym.learner.engine.host_memory import release_freed_memory

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    big = torch.ones(2 * 2**20)  # 8 MB: mmapped, and freeing it raises the threshold
    del big
    blocks = [torch.ones(2**19) for _ in range(200)]  # 200 x 2 MB in the heap
    peak = rss()
    keep = blocks[-1]  # the top of the heap stays live: trimming must reach inside it
    del blocks
    before = rss()
    released = release_freed_memory()
    after = rss()
    json.dump({"peak": peak, "before": before, "after": after, "released": released},
              sys.stdout)
""")


@needs_glibc
def test_release_returns_freed_heap_memory_to_the_os():
    import json

    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True).stdout
    r = json.loads(out)
    mb = 2**20
    assert r["released"] is True
    assert r["before"] - r["after"] > 300 * mb, r  # most of the 400 MB freed came back
    assert r["after"] < r["peak"] - 300 * mb, r


@needs_glibc
def test_cpu_engine_releases_after_backward_and_step(monkeypatch):
    calls = []
    monkeypatch.setattr("sao_gym.learner.engine.local.release_freed_memory",
                        lambda: calls.append(1) or True)
    model = torch.nn.Linear(4, 1)
    engine = LocalEngine(model, lr=0.1)
    engine.backward(model(torch.ones(2, 4)).sum())
    assert len(calls) == 2  # before (what the forward freed) and after
    weight = model.weight.detach().clone()
    norm, stepped = engine.step()
    assert stepped and norm > 0 and not torch.equal(weight, model.weight)
    assert len(calls) == 3


def test_release_host_memory_false_leaves_the_allocator_alone(monkeypatch, tiny_model_path):
    from sao_gym.learner.config import LearnerConfig
    from sao_gym.learner.engine import local_engine
    from sao_gym.models import load_policy

    calls = []
    for where in ("sao_gym.learner.engine.local.release_freed_memory",
                  "sao_gym.learner.engine.host_memory.release_freed_memory"):
        monkeypatch.setattr(where, lambda: calls.append(1) or True)
    for release, expect_calls in ((False, False), (True, True)):
        calls.clear()
        model = load_policy(tiny_model_path)[0]
        engine = local_engine(model, LearnerConfig(release_host_memory=release), 1e-3)
        ids = torch.tensor([[1, 2, 3, 4]])
        engine.backward(model(input_ids=ids).logits.float().mean())
        engine.step()
        assert bool(calls) is expect_calls, (release, len(calls))


@needs_glibc
def test_backward_releases_as_it_enters_each_decoder_layer(monkeypatch, tiny_model_path):
    from sao_gym.learner.engine.local import decoder_layers
    from sao_gym.models import load_policy

    calls = []
    monkeypatch.setattr("sao_gym.learner.engine.host_memory.release_freed_memory",
                        lambda: calls.append(1) or True)
    model = load_policy(tiny_model_path)[0]
    layers = decoder_layers(model)
    assert len(layers) == model.config.num_hidden_layers >= 2
    engine = LocalEngine(model, lr=0.1)
    with torch.no_grad():  # no graph: no hooks fire
        model(input_ids=torch.tensor([[1, 2, 3]]))
    assert calls == []
    loss = model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum()
    assert len(calls) == len(layers)  # entering each layer's forward
    loss.backward()
    assert len(calls) == 2 * len(layers)  # and its backward
    model.gradient_checkpointing_enable()
    calls.clear()
    engine.backward(model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum())
    assert len(calls) >= len(layers)  # and the engine's own two


def test_release_is_a_no_op_without_glibc(monkeypatch):
    monkeypatch.setattr(host_memory, "_malloc_trim", lambda: None)
    assert host_memory.release_freed_memory() is False


def test_no_release_for_a_gpu_engine(monkeypatch):
    calls = []
    monkeypatch.setattr("sao_gym.learner.engine.local.release_freed_memory",
                        lambda: calls.append(1) or True)
    engine = LocalEngine(torch.nn.Linear(2, 1), lr=0.1)
    engine.device = torch.device("cuda")  # only the device is read
    engine.release_host_memory()
    assert calls == []
