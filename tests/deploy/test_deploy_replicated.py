"""docker/compose.replicated.yaml and its load balancer: the file validates against the
compose spec, its party services run real commands with settings party B knows, and the
HAProxy configuration passes ``haproxy -c`` (Debian's haproxy) and routes what the compose
file says: to both replicas, on the port they serve, health-checked on /readyz, by the run id
as party B decodes it, with mutual TLS on both sides of it. The demo's certificates
(haproxy/stack-tls.sh) and its scoped, expiring, certificate-bound token (a compose secret)
are what the balancer, the replicas and party A read.

The routing and identity themselves, over real HTTPS with real replicas and HAProxy, are
tests/e2e/test_lb_routing.py's; here: the files are what they claim."""

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
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


def _stack_tls(tmp_path: Path) -> dict[str, Path]:
    """The three directories stack-tls.sh fills (balancer, replicas, party A)."""
    dirs = {name: tmp_path / name for name in ("lb", "replica", "party-a")}
    for directory in dirs.values():
        directory.mkdir()
    made = subprocess.run(
        ["sh", str(DOCKER / "haproxy" / "stack-tls.sh"), *map(str, dirs.values())],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    return dirs


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
    tls = _stack_tls(tmp_path)["lb"]
    env = {  # the compose file's paths, as stack-tls.sh fills the balancer's volume
        key: str(tls / Path(value).name) if str(value).startswith("/certs/") else str(value)
        for key, value in lb["environment"].items()
    }

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

    # the run id as party B reads it (percent-decoded), hashed consistently over the replicas
    assert "path,url_dec,field(4,/)" in text and "balance hash var(txn.run_id)" in text
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


def test_identity_goes_through_the_balancer_by_mutual_tls_on_both_hops(tmp_path: Path) -> None:
    """Client certificates required and verified at the balancer, its subject passed on in a
    header the client cannot write, and the replicas trusting only the balancer's own
    certificate (the hop CA's) to do so; the files stack-tls.sh writes are the ones each
    service reads, each service getting its own."""
    services = _compose()["services"]
    text = HAPROXY.read_text()
    replica = _env_file(DOCKER / services["party-b-1"]["env_file"][0])
    party_a = services["party-a"]
    tls = _stack_tls(tmp_path)

    assert 'ca-file "${FEDLITE_LB_CLIENT_CA}" verify required' in text
    delete = text.index("http-request del-header X-Fedlite-Client-Subject")
    assert delete < text.index("http-request set-header X-Fedlite-Client-Subject")
    assert "%[ssl_c_s_dn(,0,rfc2253)]" in text
    assert 'ssl verify required ca-file "${FEDLITE_LB_HOP_CA}" crt "${FEDLITE_LB_HOP_CERT}"' in text
    hop = subprocess.run(
        ["openssl", "x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in",
         str(tls["lb"] / "lb-hop.pem")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert hop.stdout.strip() == f"subject={replica['FEDLITE_B_TRUSTED_PROXY_SUBJECT']}"
    assert replica["FEDLITE_B_SSL_CA_CERTS"] == "/tls/hop-ca.crt"
    assert sorted(p.name for p in tls["replica"].iterdir()) == [
        Path(replica[k]).name
        for k in ("FEDLITE_B_SSL_CA_CERTS", "FEDLITE_B_SSL_CERTFILE", "FEDLITE_B_SSL_KEYFILE")
    ]
    assert sorted(p.name for p in tls["party-a"].iterdir()) == [
        "ca.crt",
        "party_a.crt",
        "party_a.key",
    ]
    assert party_a["environment"]["FEDLITE_A_CLIENT_CERT"] == "/certs/party_a.crt"
    assert not any(p.name.endswith(".key") for p in tls["lb"].iterdir())  # no CA key anywhere
    for key in [
        tls["replica"] / "replica.key",
        tls["party-a"] / "party_a.key",
        tls["lb"] / "lb.pem",
    ]:
        assert key.stat().st_mode & 0o777 == 0o600
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tls["lb"] / "client-ca.crt"),
         str(tls["party-a"] / "party_a.crt")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stderr
    again = subprocess.run(
        ["sh", str(DOCKER / "haproxy" / "stack-tls.sh"), *map(str, tls.values())],
        capture_output=True, text=True,
    )  # fmt: skip
    assert again.returncode == 0 and "keeping" in again.stdout


def test_the_demo_token_is_a_secret_scoped_expiring_and_bound_to_party_as_certificate() -> None:
    from party_b.token_file import read_token_file

    compose = _compose()
    source = DOCKER / compose["secrets"]["party-b-tokens"]["file"]
    replica = _env_file(DOCKER / compose["services"]["party-b-1"]["env_file"][0])
    mounted = compose["services"]["party-b-1"]["secrets"][0]["target"]

    (token,) = read_token_file(source)
    assert replica["FEDLITE_B_TOKENS_FILE"] == f"/run/secrets/{mounted}"
    assert "FEDLITE_B_TOKENS" not in replica
    assert token.scopes == {"train", "predict"} and token.expires_at is not None
    assert token.subject == "CN=party-a,O=FedLite demo"  # stack-tls.sh's party A certificate
    assert _env_file(DOCKER / "env" / "party_a.env")["FEDLITE_A_TOKEN"] == token.token


@pytest.mark.parametrize("name", ["party_b_replica.env", "postgres.env", "party_b_tokens.toml"])
def test_demo_secrets_are_marked_as_such(name: str) -> None:
    text = (DOCKER / "env" / name).read_text()

    assert "DEMO ONLY" in text
    assert "not-for-production" in text
