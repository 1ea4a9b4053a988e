"""bench/soak_scrape.py: the scrape comparison's table from soak results (no soak is run here)."""

from __future__ import annotations

from gpupack.bench.soak import SoakConfig, SoakResult
from gpupack.bench.soak_scrape import VARIANTS, markdown


def result(p50: float, p99: float, scrapes: int = 0, ok: bool = True) -> SoakResult:
    latency = {"filter": {"count": 100, "p50": p50, "p99": p99, "max": p99}}
    if scrapes:
        latency["metrics"] = {"count": scrapes, "p50": 1.0, "p99": 2.0, "max": 3.0}
    return SoakResult({}, 100, 1.0, 100.0, {}, 0, [], 0, [], latency, {}, 0.0, 0, False, ok)


def test_each_variant_is_compared_with_no_scraping_by_its_median_over_rounds() -> None:
    results = {v.name: [result(10.0, 40.0), result(12.0, 60.0)] for v in VARIANTS}  # medians 11 / 50
    results["/metrics back to back"] = [result(12.1, 50.0, 900), result(12.1, 70.0, 1100)]  # 12.1 / 60
    text = markdown(SoakConfig(calls=100, clients=2, nodes=10), 2, results)
    row = next(line for line in text.splitlines() if line.startswith("| /metrics back to back |"))
    assert "+10.0 %" in row and "+20.0 %" in row and "12.1 (12.1, 12.1)" in row and "| 1,000 |" in row
    none = next(line for line in text.splitlines() if line.startswith("| none |"))
    assert "—" in none
    assert "checks (no errors, no invariant violations, bounded RSS): pass" in text


def test_a_run_that_failed_its_own_checks_is_named() -> None:
    results = {v.name: [result(10.0, 40.0)] for v in VARIANTS}
    results["/metrics every 1 s"] = [result(10.0, 40.0, 5, ok=False)]
    assert "FAILED in /metrics every 1 s" in markdown(SoakConfig(calls=10, clients=1, nodes=1), 1, results)


def test_variants_can_be_chosen_and_the_command_line_says_which() -> None:
    keys = [v.key for v in VARIANTS]
    assert keys == ["none", "metrics-0", "metrics-0.1", "metrics-1", "healthz-0"]
    results = {v.name: [result(10.0, 40.0, 1)] for v in VARIANTS if v.key in ("none", "healthz-0")}
    text = markdown(SoakConfig(calls=10, clients=1, nodes=1), 1, results)
    assert "--variants none,healthz-0`" in text
    assert "| /metrics" not in text and "| /healthz back to back (control) |" in text
