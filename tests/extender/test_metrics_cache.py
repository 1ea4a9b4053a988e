"""/metrics renders at most once per `metricsMaxAgeSeconds`, however often it is scraped (#13 item 8)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from fastapi.testclient import TestClient
from prometheus_client.metrics_core import Metric

from gpupack.extender.app import create_app
from gpupack.extender.service_metrics import Metrics
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def counting_metrics(max_age: float, clock: Clock) -> tuple[Metrics, list[int]]:
    """Metrics over an empty state whose renders are counted."""
    metrics = Metrics(ClusterState(Settings()), max_age, clock)
    renders: list[int] = []
    render_registry = metrics.registry.collect

    def counted() -> Iterable[Metric]:
        renders.append(1)
        return render_registry()

    metrics.registry.collect = counted  # type: ignore[method-assign]  # a counting double on this registry
    return metrics, renders


def test_a_fresh_render_is_served_until_it_is_older_than_the_max_age() -> None:
    clock = Clock()
    metrics, renders = counting_metrics(1.0, clock)
    first = metrics.render()
    metrics.observe("filter", 200, 0.002)  # changes the text...
    clock.now += 0.5
    assert metrics.cached() == first and metrics.render() == first  # ...but the render is still fresh
    assert len(renders) == 1
    clock.now += 0.6
    assert metrics.cached() is None
    second = metrics.render()
    assert second != first and 'verb="filter"' in second.decode()
    assert len(renders) == 2


def test_max_age_zero_renders_every_scrape() -> None:
    clock = Clock()
    metrics, renders = counting_metrics(0.0, clock)
    metrics.render()
    assert metrics.cached() is None
    metrics.observe("bind", 200, 0.001)
    assert 'verb="bind"' in metrics.render().decode()
    assert len(renders) == 2


def test_scrapes_during_a_render_share_it() -> None:
    clock = Clock()
    metrics, renders = counting_metrics(1.0, clock)
    release = threading.Event()
    collect = metrics.registry.collect

    def slow() -> Iterable[Metric]:
        release.wait(5)
        return collect()

    metrics.registry.collect = slow  # type: ignore[method-assign]  # a blocking double on this registry
    texts: list[bytes] = []
    scrapers = [threading.Thread(target=lambda: texts.append(metrics.render())) for _ in range(4)]
    for scraper in scrapers:
        scraper.start()
    release.set()
    for scraper in scrapers:
        scraper.join(10)
    assert len(texts) == 4 and len(set(texts)) == 1
    assert len(renders) == 1


def test_the_app_takes_the_max_age_from_settings() -> None:
    state = ClusterState(Settings())
    for max_age, changes_seen in ((30.0, False), (0.0, True)):
        app = create_app(state, Settings(metrics_max_age_seconds=max_age))
        with TestClient(app) as client:
            client.get("/metrics")
            app.state.metrics.observe("filter", 200, 0.001)
            assert ('verb="filter"' in client.get("/metrics").text) is changes_seen
