"""docker/k8s/: every manifest validates against Kubernetes' own schemas (kubernetes-validate,
strict: an unknown field is an error) for the oldest and newest Kubernetes we name, the base
and each overlay render with kustomize (kubectl's) into objects that validate too, and the
manifests agree with party B and with each other: probes on routes party B serves, settings
party B knows, a grace period that covers the drain, the autoscaler's metric the one party B
exports and prometheus-adapter serves, Secrets that the example creates, a load balancer
whose configuration passes ``haproxy -c`` and has a slot for every replica."""

import re
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import trustme
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
        "PersistentVolumeClaim", "NetworkPolicy", "ServiceAccount",
    } <= kinds  # fmt: skip
    for document in objects:
        _validate(document, version)
    if build != "base":
        assert {o["metadata"].get("namespace") for o in objects} == {
            "fedlite" if build.endswith("production") else "fedlite-staging"
        }


# ============================================================================ party B


def test_party_b_probes_use_the_routes_party_b_serves_for_each_purpose() -> None:
    deployment = _one(_rendered("base"), "Deployment", "fedlite-b")
    container = _container(deployment)
    port = container["ports"][0]

    assert port["name"] == "http" and port["containerPort"] == 8000
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    # the readiness probe outwaits the database check's own 2 s limit
    assert container["readinessProbe"]["timeoutSeconds"] > 2
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
    lb = _one(objects, "Deployment", "fedlite-lb")
    tls = [v for v in lb["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert [v["secret"]["secretName"] for v in tls] == ["fedlite-b-tls"]
    assert secrets["fedlite-b-tls"]["type"] == "kubernetes.io/tls"


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
    ca = trustme.CA()
    cert = ca.issue_cert("fedlite.example.org")
    pem = tmp_path / "party_b.pem"  # the certificate, its key beside it as <pem>.key
    cert.cert_chain_pems[0].write_to_path(str(pem))
    cert.private_key_pem.write_to_path(str(tmp_path / "party_b.pem.key"))
    config = K8S / "base" / "haproxy.cfg"

    result = haproxy_check(config, {"FEDLITE_LB_CERT": str(pem), "POD_NAMESPACE": "fedlite"})

    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert all("could not resolve address" in line for line in warnings), warnings
    text = config.read_text()
    template = re.search(r'server-template \S+ (\d+) "([\w-]+)\.\$\{POD_NAMESPACE\}', text)
    assert template is not None
    assert re.search(r"^\s+balance uri path-only depth 3$", text, re.MULTILINE)
    for build in BUILDS:
        objects = _rendered(build)
        assert (
            int(template[1])
            >= _one(objects, "HorizontalPodAutoscaler", "fedlite-b")["spec"]["maxReplicas"]
        )
        headless = _one(objects, "Service", template[2])
        assert headless["spec"]["clusterIP"] == "None"
        lb = _one(objects, "Deployment", "fedlite-lb")
        env = {e["name"]: e for e in _container(lb)["env"]}
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        items = [v for v in lb["spec"]["template"]["spec"]["volumes"] if "secret" in v][0]
        paths = {i["key"]: i["path"] for i in items["secret"]["items"]}
        cert_path = env["FEDLITE_LB_CERT"]["value"]
        assert f"/certs/{paths['tls.crt']}" == cert_path
        assert paths["tls.key"] == paths["tls.crt"] + ".key"
