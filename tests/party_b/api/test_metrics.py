"""Party B's per-route request metrics (a pure ASGI middleware), in process."""

from pathlib import Path

import anyio
import httpx

from loadtests.scenarios import write_label_table
from party_b.api import create_app
from party_b.labels import load_label_table
from party_b.settings import Limits, Settings

TOKEN = "metrics-token-0123456789"


def _metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{{{wanted}}} in /metrics")


def test_requests_are_counted_by_route_template_and_status(tmp_path: Path) -> None:
    labels = write_label_table(tmp_path / "labels.csv", n=100)
    app = create_app(
        Settings(
            data_dir=tmp_path / "b", tokens=f"alice:{TOKEN}", limits=Limits(max_body_bytes=1024)
        ),
        labels=load_label_table(labels, id_column="id", label_column="y", feature_columns=None),
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}

    async def exercise() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://b") as client:
            await client.get("/healthz")
            await client.get("/healthz")
            await client.get("/v1/runs/abc123", headers=auth)  # 404 problem, route matched
            await client.post(
                "/v1/runs", content=b"x", headers={**auth, "Content-Type": "text/plain"}
            )
            await client.post("/v1/runs", content=b"x" * 2048, headers=auth)
            return (await client.get("/metrics")).text

    text = anyio.run(exercise)

    assert _metric(text, "fedlite_b_requests_total", route="/healthz", status="200") == 2
    assert _metric(text, "fedlite_b_requests_total", route="/v1/runs/{run_id}", status="404") == 1
    # refused by its route for the media type it declares
    assert _metric(text, "fedlite_b_requests_total", route="/v1/runs", status="415") == 1
    # refused by the body limit before routing: counted, as "unmatched"
    assert _metric(text, "fedlite_b_requests_total", route="unmatched", status="413") == 1
    assert _metric(text, "fedlite_b_request_seconds_count", route="/healthz") == 2
