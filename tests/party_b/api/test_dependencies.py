"""Every dependency of party B's routes runs on the event loop: FastAPI runs a plain ``def``
dependency in a worker thread, two thread wake-ups per request for what is an attribute read
(docs/PERFORMANCE.md, "Steps at the limit", fourth round). Work that blocks goes through
``deps.in_thread`` inside an endpoint, where it is visible."""

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from party_b.api import create_app
from party_b.settings import Settings
from tests.utils.small_runs import TOKEN, labels_csv


def _routes(routes: list[Any]) -> Iterator[APIRoute]:
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "routes"):  # a mounted or (older FastAPI) included router
            yield from _routes(route.routes)
        elif hasattr(route, "original_router"):  # an included router (FastAPI 0.16x)
            yield from _routes(route.original_router.routes)


def _sync_dependencies(dependant: Dependant) -> Iterator[str]:
    for sub in dependant.dependencies:
        call = sub.call
        assert call is not None
        function = call if inspect.isroutine(call) else type(call).__call__  # an instance
        if not inspect.iscoroutinefunction(function):
            yield getattr(call, "__qualname__", type(call).__qualname__)
        yield from _sync_dependencies(sub)


def test_no_route_of_party_b_has_a_dependency_that_goes_to_a_worker_thread(
    tmp_path: Path,
) -> None:
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"t:{TOKEN}",
        dashboard_token="operator-credential-of-this-test-0123456789",
    )
    routes = list(_routes(create_app(settings).router.routes))
    paths = {r.path for r in routes}
    steps = [r for r in routes if r.path.endswith("/steps") and "POST" in r.methods]
    assert len(steps) == 2, "the step route's two doors are among the routes walked"
    assert "/dashboard/api/overview" in paths, "and the dashboard's"
    found = {
        f"{sorted(r.methods)} {r.path}: {name}"
        for r in routes
        for name in _sync_dependencies(r.dependant)
    }
    assert found == set()
