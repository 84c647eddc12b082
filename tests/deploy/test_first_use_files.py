"""What a new user reads and runs matches: party B's image listens where every document
says (8443), both images carry examples/serve_export.py, and docs/DEPLOY.md shows party A's
``--id-column`` (issue 29's papercuts)."""

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DEPLOY = (ROOT / "docs" / "DEPLOY.md").read_text()


def test_party_bs_image_listens_where_the_documents_say() -> None:
    dockerfile = (DOCKER / "party_b.Dockerfile").read_text()
    port = re.search(r"FEDLITE_B_PORT=(\d+)", dockerfile)
    exposed = re.findall(r"^EXPOSE (\d+)$", dockerfile, flags=re.M)
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    published = compose["services"]["party-b"]["ports"][0].rsplit(":", 1)[1]

    assert port is not None and exposed == [port.group(1)] == [published] == ["8443"]
    assert "-p 8443:8443" in DEPLOY and "FEDLITE_B_PORT=8443" in DEPLOY


@pytest.mark.parametrize("image", ["party_a", "party_b"])
def test_both_images_carry_the_export_server(image: str) -> None:
    dockerfile = (DOCKER / f"{image}.Dockerfile").read_text()
    assert "COPY examples/serve_export.py /opt/fedlite/serve_export.py" in dockerfile
    final_stage = dockerfile.rsplit("FROM ", 1)[1]
    assert "serve_export.py" in final_stage  # in the image that runs, not the build stage


def test_deploy_shows_party_as_id_column() -> None:
    commands = re.findall(r"```sh\n(.*?)```", DEPLOY, flags=re.S)
    party_a = [c for c in commands if "fedlite-a align" in c or "fedlite-a train" in c]
    assert party_a and all("--id-column" in c for c in party_a), party_a


def test_the_readmes_install_size_is_the_measured_one() -> None:
    """README's figure comes from ``python -m benchmarks.install_size`` (it said 1.5 GB where
    a fresh install took 1.7)."""
    measured = json.loads((ROOT / "benchmarks" / "results" / "install_size.json").read_text())
    readme = (ROOT / "README.md").read_text()
    stated = re.search(r"installs the ([\d.]+) GB product environment", readme)
    assert stated is not None
    assert abs(float(stated.group(1)) - measured["total_gb"]) < 0.05 + 1e-9
