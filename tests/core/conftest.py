"""Fixtures of the core tests."""

import sys

import pytest


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """A folder on sys.path for modules written by a test (forgotten afterwards)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(tmp_path)):
            del sys.modules[name]
