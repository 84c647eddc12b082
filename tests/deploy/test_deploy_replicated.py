"""docker/compose.replicated.yaml and its load balancer: the file validates against the
compose spec, its party services run real commands with settings party B knows, and the
HAProxy configuration passes ``haproxy -c`` (Debian's haproxy) and routes what the compose
file says: to both replicas, on the port they serve, health-checked on /readyz, by run id.

The routing itself, over real HTTP with real replicas, is the failover benchmark's (another
issue); here: the files are what they claim."""

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from party_a.cli import build_parser as party_a_parser
from party_b.ops.cli import build_parser as party_b_parser
from party_b.settings import check_environment
from tests.utils.deploy_tools import haproxy_check

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.replicated.yaml"
HAPROXY = DOCKER / "haproxy" / "haproxy.cfg"
REPLICAS = ("party-b-1", "party-b-2")


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def _env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path}: not KEY=VALUE: {line!r}"
            pairs[key.strip()] = value.strip()
    return pairs


def _pem(tmp_path: Path) -> Path:
    """A certificate and its key in one PEM file, as lb-cert.sh writes it."""
    ca = trustme.CA()
    cert = ca.issue_cert("party-b", "localhost")
    pem = tmp_path / "party_b.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(pem))
    return pem


def test_the_replicated_compose_file_validates_against_the_compose_spec() -> None:
    checker = Path(sys.executable).parent / "check-jsonschema"
    result = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
    )

    assert result.returncode == 0, result.stdout + result.stderr


def test_its_services_run_real_commands_with_known_settings_on_declared_volumes() -> None:
    compose = _compose()
    services = compose["services"]
    declared = set(compose["volumes"])

    for name, service in services.items():
        if "build" in service:
            dockerfile = DOCKER / service["build"]["context"] / service["build"]["dockerfile"]
            assert dockerfile.is_file(), name
            if "entrypoint" in service:  # a script mounted into the image's shell
                script = service["entrypoint"][1]
                mounted = [v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == script]
                assert service["entrypoint"][0] == "sh" and mounted, name
                assert subprocess.run(["sh", "-n", str(DOCKER / mounted[0])]).returncode == 0
            else:
                parser = party_a_parser() if "party_a" in dockerfile.name else party_b_parser()
                assert parser.parse_args(service["command"]).command, name
        for env_file in service.get("env_file", []):
            assert (DOCKER / env_file).is_file(), f"{name}: {env_file}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name}: bind mount {source}"
            else:
                assert source in declared, f"{name}: undeclared volume {source}"

    assert set(REPLICAS) <= set(services) and "postgres" in services
    for replica in REPLICAS:
        settings = _env_file(DOCKER / services[replica]["env_file"][0])
        check_environment(settings)  # what party B itself checks at start-up
        assert settings["FEDLITE_B_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert "@postgres:5432/" in settings["FEDLITE_B_DATABASE_URL"]
        assert services[replica]["networks"] == ["backend"]  # never published
        assert "ports" not in services[replica]
    # the second replica starts once the first has made the tables and registered the tokens
    assert services["party-b-2"]["depends_on"]["party-b-1"]["condition"] == "service_healthy"
    assert compose["networks"]["backend"]["internal"] is True


def test_the_replicas_drain_longer_than_haproxy_takes_to_mark_them_down() -> None:
    """A replica stopped with SIGTERM stays up (503, unready) until HAProxy has marked it
    down, and compose waits for its drain before it kills it."""
    from party_b.drain import DRAIN_WAIT_LIMIT

    services = _compose()["services"]
    settings = _env_file(DOCKER / services["party-b-1"]["env_file"][0])
    check = re.search(r"inter (\d+)s fall (\d+)", HAPROXY.read_text())
    grace = re.fullmatch(r"(\d+)s", services["party-b-1"]["stop_grace_period"])

    assert check is not None and grace is not None
    marked_down = int(check[1]) * int(check[2])
    assert float(settings["FEDLITE_B_DRAIN_SECONDS"]) > marked_down
    assert int(grace[1]) >= float(settings["FEDLITE_B_DRAIN_SECONDS"]) + DRAIN_WAIT_LIMIT + 10


def test_the_load_balancer_config_passes_haproxy_check(tmp_path: Path) -> None:
    lb = _compose()["services"]["party-b"]
    env = dict(lb["environment"])
    env["FEDLITE_LB_CERT"] = str(_pem(tmp_path))  # the certificate lb-cert.sh would write

    result = haproxy_check(HAPROXY, env)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "Configuration file is valid" in result.stdout + result.stderr
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    # the replicas' names resolve only inside the compose network
    assert all("could not resolve address" in line for line in warnings), warnings


def test_the_load_balancer_routes_by_run_id_to_both_replicas_on_their_port() -> None:
    services = _compose()["services"]
    lb = services["party-b"]
    text = HAPROXY.read_text()
    port = _env_file(DOCKER / services["party-b-1"]["env_file"][0])["FEDLITE_B_PORT"]

    # /v1/runs/{id}: three path segments, hashed consistently over the replicas that are up
    assert re.search(r"^\s+balance uri path-only depth 3$", text, re.MULTILINE)
    assert re.search(r"^\s+hash-type consistent$", text, re.MULTILINE)
    assert re.search(r"^\s+option httpchk GET /readyz$", text, re.MULTILINE)
    assert "option redispatch" not in text  # a request that reached a replica stays there
    servers = re.findall(r'^\s+server (\S+) "\$\{(\w+)\}" check$', text, re.MULTILINE)
    assert [name for name, _ in servers] == list(REPLICAS)
    assert [lb["environment"][var] for _, var in servers] == [f"{r}:{port}" for r in REPLICAS]
    # party A knows the load balancer as party B, on the port and with the CA of the demo
    party_a = _env_file(DOCKER / "env" / "party_a.env")
    assert party_a["FEDLITE_A_SERVER"] == "https://party-b:8443"
    assert lb["environment"]["FEDLITE_LB_BIND"] == ":8443"
    assert lb["ports"] == ["${FEDLITE_B_PUBLISH:-127.0.0.1:8443}:8443"]
    assert "party-b" in services["demo-tls"]["command"]


def test_lb_cert_writes_one_private_pem_once(tmp_path: Path) -> None:
    pem = _pem(tmp_path)
    text = pem.read_text()
    key_at = text.index("-----BEGIN")
    (tmp_path / "c.crt").write_text(text[text.index("-----BEGIN CERTIFICATE") :])
    (tmp_path / "c.key").write_text(text[key_at : text.index("-----BEGIN CERTIFICATE")])
    script = DOCKER / "haproxy" / "lb-cert.sh"
    args = [str(tmp_path / "c.crt"), str(tmp_path / "c.key"), str(tmp_path / "out.pem")]

    first = subprocess.run(["sh", str(script), *args], capture_output=True, text=True)
    again = subprocess.run(["sh", str(script), *args], capture_output=True, text=True)

    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert "keeping it" in again.stdout
    out = tmp_path / "out.pem"
    assert out.stat().st_mode & 0o777 == 0o600
    assert "PRIVATE KEY" in out.read_text() and "CERTIFICATE" in out.read_text()


@pytest.mark.parametrize("name", ["party_b_replica.env", "postgres.env"])
def test_demo_secrets_are_marked_as_such(name: str) -> None:
    text = (DOCKER / "env" / name).read_text()

    assert "DEMO ONLY" in text
    assert "not-for-production" in text
