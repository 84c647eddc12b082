"""Settings and markers for the whole test session.

The suite mirrors the tree (tests/shared, tests/party_a, tests/party_b/{api,service,store},
tests/experiments, tests/benchmarks); tests/contract holds what an outside client relies on
(the structure rules, conformance vectors, the independent client, fuzzing). Two folders get
a marker of their own and stay out of the default run (pyproject's addopts):

    tests/e2e     marker e2e: real processes over real HTTP (kill -9, TLS, restarts, the
                  browser, the CLIs as processes): ``make test-e2e``
    tests/deploy  marker deploy: installs into fresh environments, images, compose files:
                  ``make test-deploy``
"""

import functools
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import hypothesis
import pytest

if TYPE_CHECKING:
    from fastapi import FastAPI

# One intra-op thread per process: this one and every party A / party B process the tests
# start (they inherit the environment). The test models are tiny, and torch's thread pool
# spinning on a shared 2-core machine costs several times the CPU of the work itself (a
# 60-step run: 7.3 s wall with the default pool, 1.2 s with one thread). Results stay
# reproducible: every comparison in the suite is between runs under the same setting.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before us by a plugin: apply it there too
    sys.modules["torch"].set_num_threads(1)


# httpx's module-level helpers (httpx.get, httpx.post, ...) time out after 5 s. The tests call
# them directly against real servers, and under a load of 5+ on 2 CPUs a request that loads a
# run or a model took longer: the dashboard's browser test failed on a ReadTimeout creating
# its run, which said nothing about the product. A test's direct request gets 60 s unless it
# names its own timeout; party A's client (httpx.Client) and every subprocess keep theirs.
def _patient(request: Callable[..., httpx.Response]) -> Callable[..., httpx.Response]:
    @functools.wraps(request)
    def call(*args: Any, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("timeout", 60.0)
        return request(*args, **kwargs)

    return call


for _name in ("request", "get", "post", "put", "patch", "delete", "head", "options"):
    setattr(httpx, _name, _patient(getattr(httpx, _name)))


class _PatientClient(httpx.Client):
    """The same for a test's own ``httpx.Client`` (the first request of a fresh process,
    which loads torch's lazy parts, took 9.6 s at load 11): 60 s unless it names its own.
    Party A's transport always names its timeout, so it is not affected."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("timeout", 60.0)
        super().__init__(*args, **kwargs)


httpx.Client = _PatientClient  # type: ignore[misc]


# Hypothesis draws the same examples on every run of the default suite (a verdict must not
# depend on the draw); HYPOTHESIS_PROFILE=explore draws new ones, for a search of its own.
hypothesis.settings.register_profile("default", derandomize=True)
hypothesis.settings.register_profile("explore", derandomize=False)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


_FOLDER_MARKERS = {"e2e": pytest.mark.e2e, "deploy": pytest.mark.deploy}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e or tests/deploy carries that folder's marker."""
    for item in items:
        parts = item.path.parts
        folder = parts[parts.index("tests") + 1] if "tests" in parts else ""
        if folder in _FOLDER_MARKERS:
            item.add_marker(_FOLDER_MARKERS[folder])


def _pin_secrets(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """``party_b.privacy.secret.new_secret`` gives SHA-256 of "{name} 0", "{name} 1", ..."""
    import hashlib
    import itertools

    from party_b.privacy import secret

    counter = itertools.count()
    monkeypatch.setattr(
        secret, "new_secret", lambda: hashlib.sha256(f"{name} {next(counter)}".encode()).digest()
    )


@pytest.fixture(scope="module", autouse=True)
def pinned_privacy_secrets_of_module_fixtures(request: pytest.FixtureRequest) -> Iterator[None]:
    """As ``pinned_privacy_secrets``, for the runs a module's own fixtures create (set up
    before any test's fixtures), from a sequence named by the module: the same whichever
    tests ran before. A party B in a subprocess draws its own secrets; tests that compare
    its runs to the bit turn label DP off."""
    with pytest.MonkeyPatch.context() as patch:
        _pin_secrets(patch, f"{request.module.__name__} run")
        yield


@pytest.fixture(autouse=True)
def pinned_privacy_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run a party B in this process creates gets its privacy secret from a fixed
    sequence (SHA-256 of a per-test counter) instead of the operating system's random
    bytes: under label DP, party B's default, a run's randomized labels come from its
    secret, and no test's verdict may depend on which labels a random secret flipped.
    Runs still get secrets of their own (the sequence never repeats within a test)."""
    _pin_secrets(monkeypatch, "run")


# ---------------------------------------------------------------------------- party B fixtures
# The small synthetic world of tests/utils/small_runs.py: 64 labelled ids, one token (TOKEN).


@pytest.fixture
def party_b_app(tmp_path: Path) -> "FastAPI":
    """A fresh party B app (SQLite in tmp_path, the small label table, one token)."""
    from party_b.api import create_app
    from party_b.settings import Settings
    from tests.utils.small_runs import TOKEN, labels_csv

    labels = labels_csv(tmp_path / "labels.csv")
    return create_app(Settings(data_dir=tmp_path / "b", labels=labels, tokens=f"t:{TOKEN}"))


@pytest.fixture
def party_b_client(party_b_app: "FastAPI") -> Iterator[httpx.Client]:
    """An HTTP client, authenticated with the test token, on ``party_b_app`` served by
    uvicorn in a thread of this process (real HTTP on 127.0.0.1; no process to start)."""
    from tests.utils.live import live_server
    from tests.utils.small_runs import TOKEN

    with live_server(party_b_app) as url:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            yield client


@pytest.fixture(scope="session")
def live_party_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One party B for the whole session, over real HTTP (uvicorn in a thread of this
    process) on the small label table: its base URL. Tests that share it create their own
    runs and must not depend on what others did to it."""
    from party_b.api import create_app
    from party_b.settings import Settings
    from tests.utils.live import live_server
    from tests.utils.small_runs import TOKEN, labels_csv

    root = tmp_path_factory.mktemp("live_party_b")
    settings = Settings(data_dir=root / "b", labels=labels_csv(root / "l.csv"), tokens=f"t:{TOKEN}")
    with live_server(create_app(settings)) as url:
        yield url
