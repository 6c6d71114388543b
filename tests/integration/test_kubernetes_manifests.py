"""The Kubernetes manifests: every kustomization renders with ``kubectl kustomize``, every object
validates against the Kubernetes schemas (offline, strict) or, for the Gateway API, inference
extension and llm-d objects, against their CRDs' schemas (``tests/support/crds``, each naming
the commit it was taken from), the configuration files they carry are valid gateway settings
and deploy specs, and the parts that must agree do."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy.sidecar.spec import parse_spec
from gateway.replicas.sources import DnsName, parse_source
from gateway.settings import Settings, check_settings, parse_settings
from tests.support import REPO

KUBERNETES = REPO / "deploy" / "kubernetes"
KUSTOMIZATIONS = sorted(p.parent for p in KUBERNETES.rglob("kustomization.yaml"))
INFERENCE_POOL = KUBERNETES / "overlays" / "inference-pool"
REPLICA_KUSTOMIZATIONS = [p for p in KUSTOMIZATIONS if p != INFERENCE_POOL]
"""The kustomizations whose gateway picks the tritonserver pod itself."""
CRDS = REPO / "tests" / "support" / "crds"
OBJECTIVE = "InferenceObjective"
VERSIONS = ("1.30", kubernetes_validate.latest_version())
"""The oldest Kubernetes release still commonly run, and the newest the schemas know."""


def _closed(schema: Any) -> Any:
    """``schema`` refusing the fields it does not name, as the API server prunes them (a
    misspelt field would otherwise pass unseen)."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _closed(value) for key, value in schema.items()}
    if (
        "properties" in closed
        and "additionalProperties" not in closed
        and not closed.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


@cache
def crd_schemas() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    """The vendored CRD schemas by apiVersion and kind."""
    validators = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        schema = _closed(crd["openAPIV3Schema"])
        api_version = f"{crd['group']}/{crd['version']}"
        schema["properties"]["apiVersion"] = {"const": api_version}
        schema["properties"]["kind"] = {"const": crd["kind"]}
        schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind"})
        validators[(api_version, crd["kind"])] = jsonschema.Draft7Validator(schema)
    return validators


def validate(manifest: dict[str, Any], version: str) -> None:
    """Validate ``manifest`` against its CRD's schema where one is vendored, else against the
    Kubernetes schemas of ``version``, which know no other kind (nor a CRD kind in another
    group or version)."""
    validator = crd_schemas().get((manifest["apiVersion"], manifest["kind"]))
    if validator is not None:
        validator.validate(manifest)
    else:
        kubernetes_validate.validate(manifest, version, strict=True)


@cache
def render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl renders the kustomizations; it is not installed"
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str, prefix: str) -> dict[str, Any]:
    (found,) = [
        o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith(prefix)
    ]
    return found


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name
    ]
    return found


def gateway_settings(objects: list[dict[str, Any]]) -> Settings:
    config = find(objects, "ConfigMap", "gateway-config")
    return parse_settings(yaml.safe_load(config["data"]["gateway.yaml"]))


def test_there_is_a_base_and_overlays() -> None:
    names = [str(p.relative_to(KUBERNETES)) for p in KUSTOMIZATIONS]
    assert "base" in names
    assert len([n for n in names if n.startswith("overlays/")]) >= 2


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(KUBERNETES)))
@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_validates(directory: Path, version: str) -> None:
    objects = render(directory)
    kinds = {o["kind"] for o in objects}
    assert {
        "Deployment",
        "Service",
        "ConfigMap",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
    } <= kinds
    for manifest in objects:
        validate(manifest, version)


def test_the_validator_refuses_a_broken_object() -> None:
    deployment = find(render(KUBERNETES / "base"), "Deployment", "gateway")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


@pytest.mark.parametrize(
    ("kind", "api_version"),
    [
        ("InferenceObjective", "inference.networking.x-k8s.io/v1alpha2"),
        ("InferenceObjective", "llm-d.ai/v1alpha1"),
        ("InferencePool", "inference.networking.x-k8s.io/v1alpha2"),
        ("HTTPRoute", "gateway.networking.x-k8s.io/v1"),
    ],
)
def test_a_custom_object_of_another_group_or_version_is_refused(
    kind: str, api_version: str
) -> None:
    manifest = find(
        render(INFERENCE_POOL), kind, "llama-standard" if kind == OBJECTIVE else "llama"
    )
    validate(manifest, VERSIONS[0])
    moved = {**manifest, "apiVersion": api_version}
    with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
        validate(moved, VERSIONS[0])


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("InferencePool", ("spec", "targetPorts"), 8001),
        ("InferencePool", ("spec", "targetPortNumber"), 8001),
        ("InferenceObjective", ("spec", "priority"), "high"),
        ("InferenceObjective", ("spec", "criticality"), "Critical"),
        ("HTTPRoute", ("spec", "rules"), {"backendRefs": []}),
    ],
)
def test_a_custom_object_with_a_wrong_or_unknown_field_is_refused(
    kind: str, path: tuple[str, str], value: object
) -> None:
    name = "llama-standard" if kind == OBJECTIVE else "llama"
    broken = yaml.safe_load(yaml.safe_dump(find(render(INFERENCE_POOL), kind, name)))
    broken[path[0]][path[1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, VERSIONS[0])


@pytest.mark.parametrize(
    "directory", REPLICA_KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(KUBERNETES))
)
def test_the_parts_agree(directory: Path) -> None:
    objects = render(directory)
    settings = gateway_settings(objects)
    check_settings(settings)
    spec = parse_spec(
        yaml.safe_load(find(objects, "ConfigMap", "triton-deploy-spec")["data"]["deploy.yaml"])
    )

    # The model's replicas are the headless Service in front of the tritonserver pods.
    (model,) = settings.models
    source = parse_source(model.replicas, model.routing.metrics_port)
    assert isinstance(source, DnsName)
    service = find(objects, "Service", source.host)
    assert service["spec"]["clusterIP"] == "None"
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert (ports["grpc"], ports["metrics"]) == (source.port, source.metrics_port)
    triton = find(objects, "Deployment", "triton")
    selector = service["spec"]["selector"]
    assert selector.items() <= triton["spec"]["template"]["metadata"]["labels"].items()
    server = container(triton, "tritonserver")
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert f"--grpc-port={source.port}" in server["command"]
    assert f"--metrics-port={source.metrics_port}" in server["command"]
    (sidecar,) = spec.sidecars
    assert f"--model-repository=/work/repos/{sidecar.name}" in server["command"]

    # The gateway streams over Triton's HTTP, which keeps every response only with the response
    # keeper: the init container copies it from the gateway image into the volume that
    # tritonserver preloads it from.
    assert model.transport == "http"
    assert (ports["http"], f"--http-port={ports['http']}") == (
        model.routing.http_port,
        next(arg for arg in server["command"] if arg.startswith("--http-port=")),
    )
    preload = {e["name"]: e.get("value") for e in server["env"]}["LD_PRELOAD"]
    (render_step,) = triton["spec"]["template"]["spec"]["initContainers"]
    copied = " ".join(render_step["command"])
    assert f"/usr/local/lib/triton-gateway/keep-responses.so {Path(preload).parent}/" in copied
    mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    assert preload.startswith(mounts["work"] + "/")
    assert {m["name"]: m["mountPath"] for m in render_step["volumeMounts"]}["work"] == "/work"
    dockerfile = (KUBERNETES / "Dockerfile").read_text()
    assert "COPY --from=keeper /keep-responses.so /usr/local/lib/triton-gateway/" in dockerfile
    assert "deploy/sidecar/frontend/keep_responses.c" in dockerfile
    assert model.triton_model == f"{spec.models[0].name}_{model.entry}"

    # The gateway's probes are its health routes; its grace period covers the drain.
    gateway = find(objects, "Deployment", "gateway")
    pod = gateway["spec"]["template"]["spec"]
    main = container(gateway, "gateway")
    assert main["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert main["livenessProbe"]["httpGet"]["path"] == "/health/live"
    pre_stop = main["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = int(pre_stop[1]) + settings.limits.drain_delay_s + settings.limits.shutdown_grace_s
    assert pod["terminationGracePeriodSeconds"] >= drain + 5
    container_ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert container_ports == {
        "http": settings.server.port,
        "metrics": settings.observability.metrics.port,
    }
    # Tenants reach the API port only; the metrics stay on the pod.
    api = find(objects, "Service", "gateway")
    assert [p["targetPort"] for p in api["spec"]["ports"]] == ["http"]
    # The limits are shared through the Redis the manifests run.
    assert settings.tenancy.store.kind == "redis"
    assert "redis://redis:" in (settings.tenancy.store.url or "")
    find(objects, "Service", "redis")
    hpa = find(objects, "HorizontalPodAutoscaler", "gateway")
    assert hpa["spec"]["scaleTargetRef"]["name"] == gateway["metadata"]["name"]
    pdb = find(objects, "PodDisruptionBudget", "gateway")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(gateway).items()


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


def test_the_overlays_differ_where_they_should() -> None:
    single = render(KUBERNETES / "overlays" / "single-gpu")
    multi = render(KUBERNETES / "overlays" / "multi-gpu")
    assert find(single, "Deployment", "triton")["spec"]["replicas"] == 1
    assert find(multi, "Deployment", "triton")["spec"]["replicas"] == 4
    assert find(single, "PodDisruptionBudget", "gateway")["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "gateway"}},
    }
    for objects in (single, multi):
        assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {
            "triton-gateway"
        }


def test_the_gateway_sends_the_pool_the_objectives_it_has() -> None:
    """In front of the InferencePool: the gateway's one Triton is the inference Gateway, whose
    HTTPRoute leads to the pool of the tritonserver pods over their gRPC port, and every
    objective the gateway names is an InferenceObjective of that pool, ordered as the classes."""
    objects = render(INFERENCE_POOL)
    settings = gateway_settings(objects)
    check_settings(settings)
    (model,) = settings.models
    assert not model.replicas and model.routing.inference_pool
    assert model.transport == "grpc" and model.triton_url is not None
    route = find(objects, "HTTPRoute", "llama")
    (parent,) = route["spec"]["parentRefs"]
    assert model.triton_url.split(":")[0] == parent["name"]
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    pool = find(objects, "InferencePool", backend["name"])
    assert (backend["group"], backend["kind"]) == (pool["apiVersion"].split("/")[0], pool["kind"])
    triton = find(objects, "Deployment", "triton")
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels(triton).items()
    server = container(triton, "tritonserver")
    (target,) = pool["spec"]["targetPorts"]
    assert f"--grpc-port={target['number']}" in server["command"]
    assert pool["spec"]["appProtocol"] == "kubernetes.io/h2c"
    objectives = {
        o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "InferenceObjective"
    }
    assert set(objectives) == set(model.routing.objectives.values())
    for spec in objectives.values():
        ref = spec["poolRef"]
        assert (ref["group"], ref["kind"], ref["name"]) == (
            "inference.networking.k8s.io",
            "InferencePool",
            pool["metadata"]["name"],
        )
    classes = sorted(model.routing.objectives)
    priorities = [objectives[model.routing.objectives[c]]["priority"] for c in classes]
    assert priorities == sorted(priorities) and len(set(priorities)) == len(priorities)
