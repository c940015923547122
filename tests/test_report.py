"""The docs' generated tables are what their raw data in docs/data gives (benchmarks/report.py)."""

from __future__ import annotations

import pytest

from tests.helpers import import_benchmark


@pytest.fixture(scope="module")
def report():
    return import_benchmark("report")


@pytest.mark.parametrize("doc", ["results.md", "benchmarks.md"])
def test_every_generated_table_matches_its_data(report, doc):
    text = (report.ROOT / "docs" / doc).read_text()
    new, changed = report.regenerate(text)
    assert changed == [] and new == text, f"run python benchmarks/report.py: {changed}"


def test_the_results_tables_are_generated(report):
    names = report.blocks((report.ROOT / "docs" / "results.md").read_text())
    assert {"horizon_short", "horizon_long", "curriculum_warm_starts", "keychain_failures_32",
            "vs_trl_keychain", "vs_trl_keychain_kinds", "harness_sdk_keychain",
            "curriculum_rl_32", "own_envs"} <= set(names)
    assert "demo_seeds" in report.blocks((report.ROOT / "docs" / "benchmarks.md").read_text())
    assert len(names) == len(set(names))


def test_a_stale_table_is_found_and_rewritten(report):
    table = report.GENERATORS["horizon_long"]()
    stale = table.replace("0.703 [0.644, 0.756]", "0.730 [0.644, 0.756]")
    assert stale != table
    text = f"before\n<!-- report: horizon_long -->\n{stale}\n<!-- /report -->\nafter\n"
    new, changed = report.regenerate(text)
    assert changed == ["horizon_long"]
    assert new == f"before\n<!-- report: horizon_long -->\n{table}\n<!-- /report -->\nafter\n"
    assert report.regenerate(new) == (new, [])
    with pytest.raises(KeyError, match="no generator"):
        report.regenerate("<!-- report: nothing -->\n| a |\n<!-- /report -->")
