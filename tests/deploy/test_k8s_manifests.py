"""docker/k8s/: every manifest validates against Kubernetes' own schemas (kubernetes-validate,
strict: an unknown field is an error) for the oldest and newest Kubernetes we name, the base
and each overlay render with kustomize (kubectl's) into objects that validate too, and the
manifests agree with party B and with each other: probes on routes party B serves, settings
party B knows, a grace period that covers the drain, the autoscaler's metric the one party B
exports and prometheus-adapter serves, Secrets that the example creates (the tokens as a
file of scoped, expiring, certificate-bound tokens), a load balancer whose configuration
passes ``haproxy -c``, verifies client certificates, passes the subject on over mutual TLS
and has a slot for every replica, a Namespace, NetworkPolicies that deny by default both ways
and open only the paths the deployment needs, and a public Service open to given ranges."""

import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from party_b.api.lifecycle import Lifecycle
from party_b.drain import DRAIN_WAIT_LIMIT
from party_b.ops.cli import build_parser as party_b_parser
from party_b.settings import check_environment
from tests.utils.deploy_tools import haproxy_check, kustomize_build

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "docker" / "k8s"
BUILDS = ["base", "overlays/production", "overlays/small"]
# the oldest Kubernetes still in common support, and the newest kubernetes-validate knows
KUBERNETES_VERSIONS = ["1.30.0", "1.37.0"]
MANIFESTS = sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@cache
def _rendered(build: str) -> tuple[dict[str, Any], ...]:
    return tuple(d for d in yaml.safe_load_all(kustomize_build(K8S / build)) if d)


def _one(objects: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith(name)]
    return found


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def _validate(document: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{document['kind']}/{document['metadata']['name']}: {exc}") from None


# ============================================================================ schemas


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=[str(p.relative_to(K8S)) for p in MANIFESTS])
def test_every_manifest_validates_strictly(path: Path, version: str) -> None:
    documents = _documents(path)

    assert documents
    for document in documents:
        _validate(document, version)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("build", BUILDS)
def test_every_kustomize_build_renders_objects_that_validate(build: str, version: str) -> None:
    objects = _rendered(build)

    kinds = {o["kind"] for o in objects}
    assert {
        "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ConfigMap",
        "PersistentVolumeClaim", "NetworkPolicy", "ServiceAccount", "Namespace",
    } <= kinds  # fmt: skip
    for document in objects:
        _validate(document, version)
    if build != "base":
        namespace = "fedlite" if build.endswith("production") else "fedlite-staging"
        namespaced = [o for o in objects if o["kind"] != "Namespace"]
        assert {o["metadata"].get("namespace") for o in namespaced} == {namespace}
        (created,) = [o for o in objects if o["kind"] == "Namespace"]
        assert created["metadata"]["name"] == namespace


# ============================================================================ party B


_PROBES = ("startup", "liveness", "readiness")


def test_party_b_probes_use_the_routes_party_b_serves_for_each_purpose() -> None:
    deployment = _one(_rendered("base"), "Deployment", "fedlite-b")
    container = _container(deployment)
    port = container["ports"][0]

    assert port["name"] == "https" and port["containerPort"] == 8000
    # the pods require client certificates, which only `fedlite-b health` can present
    probes = {kind: container[f"{kind}Probe"]["exec"]["command"] for kind in _PROBES}
    for kind, command in probes.items():
        assert command[0] == "fedlite-b", kind
        parsed = party_b_parser().parse_args(command[1:])
        assert parsed.command == "health" and parsed.ready == (kind == "readiness"), kind
        # each probe's own timeout outwaits the command's (and the database check's 2 s)
        assert container[f"{kind}Probe"]["timeoutSeconds"] > parsed.timeout > 2
    party_b_parser().parse_args(container["args"])  # a real fedlite-b command
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert set(limits) == set(requests) == {"cpu", "memory"}


def test_party_b_settings_are_ones_it_knows_and_its_secrets_exist() -> None:
    objects = _rendered("base")
    config = _one(objects, "ConfigMap", "fedlite-b-config")["data"]
    container = _container(_one(objects, "Deployment", "fedlite-b"))
    secrets = {s["metadata"]["name"]: s for s in _documents(K8S / "examples/secrets.example.yaml")}

    check_environment(config)  # what party B checks at start-up: every key is a setting
    check_environment({e["name"]: "x" for e in container["env"]})
    assert config["FEDLITE_B_PORT"] == str(container["ports"][0]["containerPort"])
    assert "FEDLITE_B_DATABASE_URL" not in config and "FEDLITE_B_TOKENS" not in config
    for variable in container["env"]:
        ref = variable["valueFrom"]["secretKeyRef"]
        assert ref["key"] in secrets[ref["name"]]["stringData"], variable
    # every file a pod reads from a Secret is one the example has, where the settings say
    for deployment in ("fedlite-b", "fedlite-lb"):
        pod = _one(objects, "Deployment", deployment)["spec"]["template"]["spec"]
        for volume in (v for v in pod["volumes"] if "secret" in v):
            named = secrets[volume["secret"]["secretName"]]["stringData"]
            assert {i["key"] for i in volume["secret"]["items"]} <= set(named), volume
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert config["FEDLITE_B_TOKENS_FILE"] == f"{mounts['tokens']}/tokens.toml"
    for setting in ("FEDLITE_B_SSL_CERTFILE", "FEDLITE_B_SSL_KEYFILE", "FEDLITE_B_SSL_CA_CERTS"):
        assert config[setting].startswith(mounts["tls"] + "/"), setting
    assert secrets["fedlite-b-tls"]["type"] == "kubernetes.io/tls"


def test_the_tokens_secret_holds_scoped_expiring_certificate_bound_tokens(
    tmp_path: Path,
) -> None:
    from party_b.token_file import read_token_file

    secrets = {s["metadata"]["name"]: s for s in _documents(K8S / "examples/secrets.example.yaml")}
    path = tmp_path / "tokens.toml"
    path.write_text(secrets["fedlite-b-tokens"]["stringData"]["tokens.toml"])

    tokens = read_token_file(path)  # what party B reads at start-up

    assert [t.scopes for t in tokens] == [{"train"}, {"predict"}]
    assert all(t.expires_at is not None and t.subject for t in tokens)
    assert tokens[1].runs_of == tokens[0].name


def test_the_grace_period_covers_prestop_drain_and_in_flight_requests() -> None:
    objects = _rendered("base")
    config = _one(objects, "ConfigMap", "fedlite-b-config")["data"]
    pod = _one(objects, "Deployment", "fedlite-b")["spec"]["template"]["spec"]
    pre_stop = _container({"spec": {"template": {"spec": pod}}})["lifecycle"]["preStop"]

    assert pre_stop["exec"]["command"][0] == "sleep"
    needed = float(pre_stop["exec"]["command"][1]) + float(config["FEDLITE_B_DRAIN_SECONDS"])
    needed += DRAIN_WAIT_LIMIT + 10  # the checkpoints and the exit
    assert pod["terminationGracePeriodSeconds"] >= needed
    # the drain outlasts HAProxy's time to mark a replica down (inter x fall)
    check = re.search(r"inter (\d+)s fall (\d+)", (K8S / "base" / "haproxy.cfg").read_text())
    assert check is not None
    assert float(config["FEDLITE_B_DRAIN_SECONDS"]) > int(check[1]) * int(check[2])


def test_disruption_budgets_leave_pods_serving() -> None:
    for build in BUILDS:
        objects = _rendered(build)
        for name in ("fedlite-b", "fedlite-lb"):
            spec = _one(objects, "PodDisruptionBudget", name)["spec"]
            assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/name": name}
            assert spec.get("maxUnavailable") == 1 or spec.get("minAvailable") == 1
        hpa = _one(objects, "HorizontalPodAutoscaler", "fedlite-b")["spec"]
        lb_replicas = _one(objects, "Deployment", "fedlite-lb")["spec"]["replicas"]
        if lb_replicas == 1:  # minAvailable 1 of 1 would block every node drain
            assert "maxUnavailable" in _one(objects, "PodDisruptionBudget", "fedlite-lb")["spec"]
        assert hpa["minReplicas"] >= 1 and hpa["maxReplicas"] >= hpa["minReplicas"]


# ============================================================================ autoscaling


def test_the_autoscaler_scales_on_the_gauge_party_b_exports_via_the_adapter_rule() -> None:
    registry = CollectorRegistry()
    Lifecycle(registry)
    exported = {m.name for m in registry.collect()}
    hpa = _one(_rendered("base"), "HorizontalPodAutoscaler", "fedlite-b")
    (metric,) = hpa["spec"]["metrics"]
    adapter = _documents(K8S / "examples" / "prometheus-adapter.yaml")[0]
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]

    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    assert name in exported
    assert rule["seriesQuery"].startswith(f"{name}{{")
    assert re.fullmatch(rule["name"]["matches"], name) and rule["name"]["as"] == name
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    assert hpa["spec"]["scaleTargetRef"]["name"] == "fedlite-b"
    annotations = _one(_rendered("base"), "Deployment", "fedlite-b")["spec"]["template"][
        "metadata"
    ]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics"


# ============================================================================ load balancer


def test_the_load_balancer_config_passes_haproxy_check_and_has_a_slot_per_replica(
    tmp_path: Path,
) -> None:
    from party_b.ops.certs import stack_certificates

    tls = stack_certificates(tmp_path / "tls")
    pem = tmp_path / "party_b.pem"  # the certificate, its key beside it as <pem>.key
    pem.write_bytes(tls.path("lb.crt").read_bytes())
    (tmp_path / "party_b.pem.key").write_bytes(tls.path("lb.key").read_bytes())
    hop = tmp_path / "lb.pem"
    hop.write_bytes(tls.path("lb-hop.crt").read_bytes())
    (tmp_path / "lb.pem.key").write_bytes(tls.path("lb-hop.key").read_bytes())
    config = K8S / "base" / "haproxy.cfg"
    env = {
        "FEDLITE_LB_CERT": str(pem),
        "FEDLITE_LB_CLIENT_CA": str(tls.ca),
        "FEDLITE_LB_HOP_CA": str(tls.hop_ca),
        "FEDLITE_LB_HOP_CERT": str(hop),
        "POD_NAMESPACE": "fedlite",
    }

    result = haproxy_check(config, env)

    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert all("could not resolve address" in line for line in warnings), warnings
    text = config.read_text()
    template = re.search(r'server-template \S+ (\d+) "([\w-]+)\.\$\{POD_NAMESPACE\}', text)
    assert template is not None
    assert "path,url_dec,field(4,/)" in text and "balance hash var(txn.run_id)" in text
    assert 'ca-file "${FEDLITE_LB_CLIENT_CA}" verify required' in text
    assert "%[ssl_c_s_dn(,0,rfc2253)]" in text
    assert 'ssl verify required ca-file "${FEDLITE_LB_HOP_CA}" crt "${FEDLITE_LB_HOP_CERT}"' in text
    for build in BUILDS:
        objects = _rendered(build)
        assert (
            int(template[1])
            >= _one(objects, "HorizontalPodAutoscaler", "fedlite-b")["spec"]["maxReplicas"]
        )
        headless = _one(objects, "Service", template[2])
        assert headless["spec"]["clusterIP"] == "None"
        lb = _one(objects, "Deployment", "fedlite-lb")
        env_of = {e["name"]: e for e in _container(lb)["env"]}
        assert env_of["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        volumes = {v["name"]: v for v in lb["spec"]["template"]["spec"]["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in _container(lb)["volumeMounts"]}
        for variable, volume, key in [
            ("FEDLITE_LB_CERT", "tls", "tls.crt"),
            ("FEDLITE_LB_CLIENT_CA", "client-ca", "ca.crt"),
            ("FEDLITE_LB_HOP_CA", "hop", "ca.crt"),
            ("FEDLITE_LB_HOP_CERT", "hop", "tls.crt"),
        ]:
            paths = {i["key"]: i["path"] for i in volumes[volume]["secret"]["items"]}
            assert env_of[variable]["value"] == f"{mounts[volume]}/{paths[key]}", variable
            if key == "tls.crt":  # HAProxy reads the key beside the certificate
                assert paths["tls.key"] == paths["tls.crt"] + ".key"
        config_map = _one(objects, "ConfigMap", "fedlite-b-config")["data"]
        subject = subprocess.run(
            ["openssl", "x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in", str(hop)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert subject.stdout.strip() == f"subject={config_map['FEDLITE_B_TRUSTED_PROXY_SUBJECT']}"


# ============================================================================ network


def _policy(objects: tuple[dict[str, Any], ...], name: str) -> dict[str, Any]:
    (found,) = [
        o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == name
    ]
    spec: dict[str, Any] = found["spec"]
    return spec


def test_network_policies_deny_by_default_and_open_only_the_deployments_paths() -> None:
    objects = _rendered("overlays/production")
    deny = _policy(objects, "fedlite-default-deny")
    lb, pods = _policy(objects, "fedlite-lb"), _policy(objects, "fedlite-b")
    (service,) = [
        o["spec"]
        for o in objects
        if o["kind"] == "Service" and o["metadata"]["name"] == "fedlite-b"
    ]

    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    for policy in (lb, pods):
        assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    # party A -> the balancer's TLS port, from given ranges only; the public Service the same
    (clients,) = [r for r in lb["ingress"] if r["ports"][0]["port"] == "https"]
    ranges = [peer["ipBlock"]["cidr"] for peer in clients["from"]]
    assert ranges and service["type"] == "LoadBalancer"
    assert service["loadBalancerSourceRanges"] == ranges
    # the balancer -> the pods' port; the pods -> PostgreSQL; both -> DNS, nothing else
    pod_port = _container(_one(objects, "Deployment", "fedlite-b"))["ports"][0]["containerPort"]
    to_pods = [r for r in lb["egress"] if "podSelector" in r["to"][0]]
    assert (
        to_pods[0]["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "fedlite-b"
    )
    assert {p["port"] for p in to_pods[0]["ports"]} == {pod_port}
    database = [r for r in pods["egress"] if "ipBlock" in r["to"][0]]
    assert [p["port"] for p in database[0]["ports"]] == [5432]
    for policy in (lb, pods):
        dns = [r for r in policy["egress"] if r["ports"][0]["port"] == 53]
        assert {p["protocol"] for p in dns[0]["ports"]} == {"UDP", "TCP"}
        assert len(policy["egress"]) == 2
    sources = {
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
        for rule in pods["ingress"]
        for peer in rule["from"]
    }
    assert sources == {"fedlite-lb", "prometheus"}
