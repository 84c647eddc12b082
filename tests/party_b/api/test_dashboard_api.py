"""The dashboard's data and access over real HTTP, and the per-run metrics on /metrics
(the page itself is tested in a browser: tests/e2e/test_dashboard.py)."""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from party_b import auth
from party_b.api import create_app
from party_b.dashboard.health import quantile
from party_b.errors import StartupError
from party_b.settings import Settings
from party_b.store import make_engine, make_session_factory
from shared.accounting import raw_step_request_bytes
from tests.utils.live import live_server
from tests.utils.small_runs import MSGPACK, OTHER, TOKEN, aligned_run, labels_csv

OPERATOR = "operator-credential-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[3]
GRAFANA = ROOT / "docker" / "grafana-dashboard.json"


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "data_dir": tmp_path / "b",
        "labels": labels_csv(tmp_path / "labels.csv"),
        "tokens": f"tester:{TOKEN},other:{OTHER}",
    }
    return Settings(**{**base, **overrides})


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    # privacy off: the tests hold the operator's views against the step log party A reads,
    # which under label DP (the default) carries no loss; the loss on /metrics is opted in
    settings = _settings(
        tmp_path, dashboard_token=OPERATOR, privacy="off", metrics_label_series=True
    )
    with live_server(create_app(settings)) as base:
        yield base


@pytest.fixture
def trained(url: str) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    """A run of 'tester' with 6 real steps and one evaluation: (url, run id, its step log)."""
    with httpx.Client(base_url=url, headers=_bearer(TOKEN), timeout=60) as client:
        run = aligned_run(client)
        for step in range(1, 7):
            client.post(f"/v1/runs/{run.id}/steps", content=run.step_body(step), headers=MSGPACK)
        evaluated = client.post(
            f"/v1/runs/{run.id}/evaluate", content=run.evaluate_body(), headers=MSGPACK
        )
        assert evaluated.status_code == 200, evaluated.text
        log = client.get(f"/v1/runs/{run.id}/steps").json()["steps"]
    assert [row["step"] for row in log] == [1, 2, 3, 4, 5, 6]
    yield url, run.id, log


def test_the_dashboard_is_off_unless_the_operator_sets_its_credential(tmp_path: Path) -> None:
    with live_server(create_app(_settings(tmp_path))) as base:
        for path in ("/dashboard/", "/dashboard/static/dashboard.js", "/dashboard/api/overview"):
            answer = httpx.get(base + path, headers=_bearer(OPERATOR))
            assert answer.status_code == 404, path
            assert answer.headers["content-type"] == "application/problem+json"


def test_each_secret_opens_its_own_door_only(url: str) -> None:
    overview = f"{url}/dashboard/api/overview"
    refused = {
        "no credential": httpx.get(overview),
        "a party A token": httpx.get(overview, headers=_bearer(TOKEN)),
        "a near miss": httpx.get(overview, headers=_bearer(OPERATOR[:-1] + "x")),
        "another scheme": httpx.get(overview, headers={"Authorization": f"Basic {OPERATOR}"}),
        "a run, with a party A token": httpx.get(
            f"{url}/dashboard/api/runs/0123abcd", headers=_bearer(TOKEN)
        ),
        "the API, with the operator credential": httpx.get(
            f"{url}/v1/runs", headers=_bearer(OPERATOR)
        ),
    }
    for what, answer in refused.items():
        assert answer.status_code == 401, what
        assert answer.json()["type"] == "urn:fedlite:problem:unauthorized", what
    assert httpx.get(overview, headers=_bearer(OPERATOR)).status_code == 200
    assert httpx.get(f"{url}/v1/runs", headers=_bearer(TOKEN)).status_code == 200


def test_the_page_and_its_files_are_local_and_locked_down(url: str) -> None:
    page = httpx.get(f"{url}/dashboard", follow_redirects=True)
    assert page.status_code == 200 and page.url.path == "/dashboard/"
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
    # every file the page names is one of ours, and is served
    named = re.findall(r'(?:href|src)="([^"]+)"', page.text)
    assert named and all(name.startswith("static/") for name in named)
    for name in named:
        asset = httpx.get(f"{url}/dashboard/{name}")
        assert asset.status_code == 200 and asset.content, name
        assert asset.headers["x-content-type-options"] == "nosniff"
    assert "http" not in httpx.get(f"{url}/dashboard/static/dashboard.js").text.replace("HTTP ", "")
    for missing in ("nothing.js", "..%2Froutes.py", "%2E%2E%2F__init__.py"):
        assert httpx.get(f"{url}/dashboard/static/{missing}").status_code == 404, missing


def test_start_up_refuses_a_credential_that_is_also_an_api_token(tmp_path: Path) -> None:
    party_a = "party-a-token-0123456789abcdef"
    with pytest.raises(StartupError, match="API token of 'party-a'"):
        create_app(_settings(tmp_path, tokens=f"party-a:{party_a}", dashboard_token=party_a))
    revoked = "revoked-token-0123456789abcdef"
    settings = _settings(tmp_path)
    engine = make_engine(settings.resolved_database_url())
    with make_session_factory(engine)() as session:
        auth.register_token(session, "old", revoked)
        auth.revoke_token(session, "old")
    engine.dispose()
    with pytest.raises(StartupError, match="API token of 'old'"):
        create_app(_settings(tmp_path, dashboard_token=revoked))
    for weak in ("short-credential", "a credential with spaces in it"):
        with pytest.raises(ValidationError, match="visible ASCII"):
            _settings(tmp_path, dashboard_token=weak)


def test_a_run_s_report_follows_its_real_steps(
    trained: tuple[str, str, list[dict[str, Any]]],
) -> None:
    url, run_id, log = trained
    with httpx.Client(base_url=url, headers=_bearer(OPERATOR), timeout=60) as operator:
        overview = operator.get("/dashboard/api/overview").json()
        report = operator.get(f"/dashboard/api/runs/{run_id}").json()
        coarse = operator.get(f"/dashboard/api/runs/{run_id}", params={"points": 2}).json()
        missing = operator.get("/dashboard/api/runs/0123abcd")
        too_many = operator.get(f"/dashboard/api/runs/{run_id}", params={"points": 10**6})

    row = next(r for r in overview["runs"] if r["id"] == run_id)
    shown = (row["owner"], row["status"], row["step"], row["checkpoint"])
    assert shown == ("tester", "training", 6, 6)
    assert (row["aligned"], row["train"] + row["eval"]) == (32, 32) and row["in_memory"]
    server = overview["server"]
    assert server["open_runs"] == 1 and server["memory_bytes"] > 10**6
    steps_route = next(r for r in server["latency"] if r["route"] == "/v1/runs/{run_id}/steps")
    # 6 steps and the one GET of the step log: one route template, by path
    assert steps_route["requests"] == 7 and steps_route["p50_ms"] > 0

    up = sum(r["bytes_in"] for r in log)
    raw = raw_step_request_bytes(d=8, batch=8)
    assert [(p["first"], p["last"]) for p in report["points"]] == [(s, s) for s in range(1, 7)]
    assert [p["loss"] for p in report["points"]] == pytest.approx([r["loss"] for r in log])
    assert report["traffic"]["up_total"] == up and report["traffic"]["raw_per_step"] == raw
    assert report["traffic"]["compression"] == pytest.approx(raw * 6 / up)
    assert report["traffic"]["down_per_step"] == pytest.approx(sum(r["bytes_out"] for r in log) / 6)
    assert [(e["step"], e["split"]) for e in report["evaluations"]] == [(6, "eval")]
    assert report["width"] == 1 and coarse["width"] == 3
    assert [(p["first"], p["last"]) for p in coarse["points"]] == [(1, 3), (4, 6)]
    assert coarse["points"][0]["up_bytes"] == pytest.approx(sum(r["bytes_in"] for r in log[:3]) / 3)
    assert missing.status_code == 404 and too_many.status_code == 422


def _samples(text: str) -> dict[str, float]:
    """'name{labels}' -> value of every sample line of a Prometheus text page."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            found[key] = float(value)
    return found


def test_metrics_carry_each_run_s_progress_loss_and_the_process(
    trained: tuple[str, str, list[dict[str, Any]]],
) -> None:
    url, run_id, log = trained
    text = httpx.get(f"{url}/metrics", headers=_bearer(OPERATOR)).text
    samples = _samples(text)

    def of_run(name: str, **extra: str) -> float:
        labels = {"name": "t", "owner": "tester", "run_id": run_id, **extra}
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
        return samples[key]

    assert of_run("fedlite_b_run_step") == 6 and of_run("fedlite_b_run_steps") == 1000
    assert of_run("fedlite_b_run_loss") == pytest.approx(log[-1]["loss"])
    assert of_run("fedlite_b_run_received_bytes") == sum(r["bytes_in"] for r in log)
    assert of_run("fedlite_b_run_checkpoint_step") == 6
    assert of_run("fedlite_b_run_aligned_samples") == 32
    assert of_run("fedlite_b_run_eval_metric", split="eval", metric="accuracy") <= 1
    assert samples['fedlite_b_runs{status="training"}'] == 1
    assert samples["process_resident_memory_bytes"] > 10**6

    # every series the Grafana board plots is one party B serves
    board = json.loads(GRAFANA.read_text())
    expressions = [t["expr"] for p in board["panels"] for t in p["targets"]]
    names = set(re.findall(r"\b((?:fedlite_b|process)_[a-z_]+)", " ".join(expressions)))
    served = {key.split("{")[0] for key in samples}
    assert names and names <= served, names - served
    assert all(p["datasource"]["uid"] == "${datasource}" for p in board["panels"])
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in board["panels"])


def test_latency_quantiles_are_read_from_the_histogram_as_promql_does() -> None:
    buckets = [(0.1, 5.0), (0.5, 10.0), (float("inf"), 10.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.1)
    assert quantile(0.95, buckets) == pytest.approx(0.1 + 0.4 * 4.5 / 5)
    assert quantile(0.95, [(0.1, 1.0), (float("inf"), 10.0)]) == pytest.approx(0.1)
    assert quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None


def test_an_install_carries_every_file_the_page_serves() -> None:
    import tomllib

    from party_b.dashboard.routes import STATIC_FILES

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    static = ROOT / "party_b" / "dashboard" / "static"
    assert package_data["party_b.dashboard"] == ["static/*"]
    assert sorted(p.name for p in static.iterdir()) == sorted(STATIC_FILES)


def test_a_run_with_several_parties_shows_each_party_and_its_traffic(tmp_path: Path) -> None:
    """docs/PROTOCOL.md 12: the run's report lists its feature parties, each with its width,
    quantizer, downlink and its own bytes both ways; the run's totals are their sums."""
    from functools import partial

    from tests.utils.parties import party_run, together

    app = create_app(_settings(tmp_path, dashboard_token=OPERATOR))
    with live_server(app) as url:
        parties = party_run(url, TOKEN, app.state.sessions, {"bank": 4, "shop": 8})
        assert {a.status_code for a in together(*(p.align for p in parties))} == {200}
        sent: dict[str, int] = {"bank": 0, "shop": 0}
        received: dict[str, int] = {"bank": 0, "shop": 0}
        for t in (1, 2, 3):
            bodies = {p.name: p.step_body(t) for p in parties}
            answers = together(*(partial(p.step, t, bodies[p.name]) for p in parties))
            for party, answer in zip(parties, answers, strict=True):
                assert answer.status_code == 200, answer.text
                sent[party.name] += len(bodies[party.name])
                received[party.name] += len(answer.content)
        with httpx.Client(base_url=url, headers=_bearer(OPERATOR), timeout=60) as operator:
            report = operator.get(f"/dashboard/api/runs/{parties[0].run_id}").json()
            overview = operator.get("/dashboard/api/overview").json()

    shown = [
        (p["name"], p["cut_dim"], p["quantizer"], p["downlink"], p["steps"])
        for p in report["parties"]
    ]
    assert shown == [("bank", 4, "raw", "float32", 3), ("shop", 8, "raw", "float32", 3)]
    assert {p["name"]: p["up_total"] for p in report["parties"]} == sent
    assert {p["name"]: p["down_total"] for p in report["parties"]} == received
    assert report["traffic"]["up_total"] == sum(sent.values())
    row = next(r for r in overview["runs"] if r["id"] == parties[0].run_id)
    assert row["mode"] == "2 parties" and row["step"] == 3
