"""deploy/rayservice.yaml against what KubeRay and Ray Serve document; no cluster is at hand.

The checker below is a small schema written from KubeRay's API types and validation code
(each rule names its source, paths in github.com/ray-project/kuberay), Ray Serve's own
config schema (`ray.serve.schema`, installed with the `ray` extra), and vaecast's own
command-line parser for the front ends' command. The API server prunes fields a CRD does
not know without a word, so a misspelt field is an error here. A checker that cannot fail
proves nothing: broken copies of the manifest must each be rejected, with the problem named.
"""

from __future__ import annotations

import copy
import ipaddress
import os
import re
import shlex
import subprocess
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml  # PyYAML: a dependency of ray[serve], so of the `ray` extra

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
MANIFEST = DEPLOY / "rayservice.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"

Doc = dict[str, Any]

# The sources of the rules, named by these keys in the comments below (paths in
# github.com/ray-project/kuberay, pages of docs.ray.io):
#   TYPES          ray-operator/apis/ray/v1/raycluster_types.go
#   SERVICE_TYPES  ray-operator/apis/ray/v1/rayservice_types.go
#   VALIDATION     ray-operator/controllers/ray/utils/validation.go
#   WEBHOOK        ray-operator/apis/ray/v1/raycluster_webhook.go
#   CONSTANTS      ray-operator/controllers/ray/utils/constant.go
#   CONTROLLER     ray-operator/controllers/ray/rayservice_controller.go
#   SAMPLE         ray-operator/config/samples/ray-service.sample.yaml
#   POD_COMMAND    docs.ray.io: cluster/kubernetes/user-guides/pod-command
#   GPU_GUIDE      docs.ray.io: cluster/kubernetes/user-guides/gpu

# RayServiceSpec's fields (SERVICE_TYPES; rayClusterDeletionDelaySeconds is read by
# ValidateRayServiceSpec in VALIDATION).
SERVICE_SPEC_FIELDS = {
    "serveConfigV2": str,
    "rayClusterConfig": dict,
    "serveService": dict,
    "upgradeStrategy": dict,
    "rayClusterDeletionDelaySeconds": int,
    "excludeHeadPodFromServeSvc": bool,
    "serviceUnhealthySecondThreshold": int,  # deprecated, still accepted
    "deploymentUnhealthySecondThreshold": int,  # deprecated, still accepted
}
# RayClusterSpec (TYPES; authOptions: IsAuthEnabled in VALIDATION).
CLUSTER_SPEC_FIELDS = {
    "suspend": bool,
    "managedBy": str,
    "autoscalerOptions": dict,
    "headServiceAnnotations": dict,
    "enableInTreeAutoscaling": bool,
    "gcsFaultToleranceOptions": dict,
    "headGroupSpec": dict,
    "rayVersion": str,
    "workerGroupSpecs": list,
    "authOptions": dict,
}
# HeadGroupSpec (TYPES; resources and labels: validateRayGroupResources/Labels in VALIDATION).
HEAD_FIELDS = {
    "template": dict,
    "headService": dict,
    "enableIngress": bool,
    "rayStartParams": dict,
    "serviceType": str,
    "resources": dict,
    "labels": dict,
}
# WorkerGroupSpec (TYPES, VALIDATION as above).
WORKER_FIELDS = {
    "suspend": bool,
    "groupName": str,
    "replicas": int,
    "minReplicas": int,
    "maxReplicas": int,
    "idleTimeoutSeconds": int,
    "rayStartParams": dict,
    "template": dict,
    "scaleStrategy": dict,
    "numOfHosts": int,
    "resources": dict,
    "labels": dict,
}
# json tags without omitempty (TYPES): the CRD lists them as required. minReplicas and
# maxReplicas have defaults there; we still ask for them, since without the autoscaler
# ValidateRayClusterSpec (VALIDATION) refuses a worker group that lacks either.
HEAD_REQUIRED = ("template", "rayStartParams")
WORKER_REQUIRED = ("groupName", "template", "rayStartParams", "minReplicas", "maxReplicas")

# A DNS-1035 label (k8s.io/apimachinery validation.IsDNS1035Label), which
# ValidateRayServiceMetadata (VALIDATION) demands of a RayService's name.
DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# MaxRayServiceNameLength = MaxRayClusterNameLength (53) - 6 (CONSTANTS).
MAX_RAYSERVICE_NAME = 53 - 6
K8S_SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")  # HeadGroupSpec.serviceType
# Ports Ray itself listens on in a KubeRay pod: GCS, dashboard, client, Serve's proxy,
# metrics (KubeRay's --metrics-export-port), the dashboard agent.
RAY_PORTS = frozenset({6379, 8265, 10001, 8000, 8080, 52365})
OVERWRITE_CMD = "ray.io/overwrite-container-cmd"
GEN_CMD = "KUBERAY_GEN_RAY_START_CMD"
API_KEY_ENV = "VAECAST_API_KEY"


@dataclass(frozen=True, slots=True)
class ServeNames:
    """What the serveConfigV2 must name for vaecast's front ends to find the replicas."""

    app: str
    deployment: str
    import_path: str


# The application builder serveConfigV2 names: Ray Serve imports it on the cluster and
# calls it with the config's `args` (Serve's "application builders").
BUILDER = "vaecast.cluster.replica:build_app"


def vaecast_serve_names() -> ServeNames:
    from vaecast.cluster.records import APP_NAME, DEPLOYMENT_NAME

    return ServeNames(APP_NAME, DEPLOYMENT_NAME, BUILDER)


# ---------------------------------------------------------------------------
# The checker


def load(path: Path = MANIFEST) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def manifest_problems(docs: list[Doc], names: ServeNames) -> list[str]:
    """Every rule `docs` breaks, as sentences; [] when it passes."""
    problems: list[str] = []
    services = [d for d in docs if d.get("kind") == "RayService"]
    k8s_services = [d for d in docs if d.get("kind") == "Service"]
    if len(services) != 1 or len(k8s_services) != 1 or len(docs) != 2:
        kinds = [d.get("kind") for d in docs]
        return [f"expected one RayService and one Service, found {kinds}"]
    rayservice, service = services[0], k8s_services[0]
    problems += rayservice_problems(rayservice)
    if problems:  # the rest reads fields these rules vouch for
        return problems
    cluster = rayservice["spec"]["rayClusterConfig"]
    serve = serve_config_problems(rayservice["spec"].get("serveConfigV2"), names, cluster, problems)
    if serve is not None:
        problems += gpu_problems(serve.deployment, names, cluster)
    problems += image_problems(cluster)
    problems += command_problems(rayservice)
    problems += frontend_problems(cluster, service, serve)
    return problems


def fields_problems(
    where: str, value: Any, fields: dict[str, type], required: tuple[str, ...] = ()
) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where} must be a mapping"]
    problems = [f"{where}.{key} is required" for key in required if key not in value]
    for key, item in value.items():
        if key not in fields:
            problems.append(f"{where}.{key} is an unknown field (the API server drops it)")
        elif not _is_type(item, fields[key]):
            problems.append(f"{where}.{key} must be a {fields[key].__name__}")
    return problems


def _is_type(value: Any, kind: type) -> bool:
    if kind is int:  # YAML booleans are not int32s
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def rayservice_problems(doc: Doc) -> list[str]:
    problems: list[str] = []
    if doc.get("apiVersion") != "ray.io/v1":  # the storage version (SERVICE_TYPES)
        problems.append("the RayService's apiVersion must be ray.io/v1")
    name = doc.get("metadata", {}).get("name", "")
    if not DNS1035.fullmatch(name) or len(name) > MAX_RAYSERVICE_NAME:
        problems.append(
            f"metadata.name {name!r} must be a DNS-1035 label of at most "
            f"{MAX_RAYSERVICE_NAME} characters (ValidateRayServiceMetadata)"
        )
    spec = doc.get("spec")
    # rayClusterConfig's json tag has no omitempty (SERVICE_TYPES): required.
    problems += fields_problems("spec", spec, SERVICE_SPEC_FIELDS, ("rayClusterConfig",))
    if problems:
        return problems
    cluster = spec["rayClusterConfig"]
    problems += fields_problems(
        "rayClusterConfig", cluster, CLUSTER_SPEC_FIELDS, ("headGroupSpec",)
    )
    if problems:
        return problems
    head = cluster["headGroupSpec"]
    problems += fields_problems("headGroupSpec", head, HEAD_FIELDS, HEAD_REQUIRED)
    problems += group_problems("headGroupSpec", head)
    seen: set[str] = set()
    for index, group in enumerate(cluster.get("workerGroupSpecs", [])):
        where = f"workerGroupSpecs[{index}]"
        found = fields_problems(where, group, WORKER_FIELDS, WORKER_REQUIRED)
        problems += found
        if found:
            continue
        problems += group_problems(where, group)
        if group["groupName"] in seen:  # validateWorkerGroups (WEBHOOK)
            problems.append(f"{where}: worker group names must be unique")
        seen.add(group["groupName"])
        low, high = group["minReplicas"], group["maxReplicas"]
        if low < 0 or high < 0 or low > high:  # ValidateRayClusterSpec (VALIDATION)
            problems.append(
                f"{where}: minReplicas {low} and maxReplicas {high} are not 0 <= min <= max"
            )
    return problems


def group_problems(where: str, group: Doc) -> list[str]:
    problems: list[str] = []
    params = group.get("rayStartParams", {})
    # map[string]string (TYPES): `num-cpus: 0` unquoted is an integer, and refused.
    for key, value in params.items() if isinstance(params, dict) else ():
        if not isinstance(value, str):
            problems.append(f"{where}.rayStartParams.{key} must be a string, not {value!r}")
    if "labels" in params:  # validateRayGroupLabels (VALIDATION)
        problems.append(f"{where}.rayStartParams.labels is not supported")
    # ValidateRayClusterSpec (VALIDATION): at least one container; a PodSpec container
    # needs a name, and KubeRay's Ray container (index 0) an image.
    containers = group.get("template", {}).get("spec", {}).get("containers")
    if not isinstance(containers, list) or not containers:
        return [*problems, f"{where} should have at least one container"]
    for container in containers:
        if not isinstance(container.get("name"), str) or not isinstance(
            container.get("image"), str
        ):
            problems.append(f"{where}: every container needs a name and an image")
    return problems


@dataclass(frozen=True, slots=True)
class ServeApp:
    """vaecast's application in serveConfigV2, and its decoder deployment."""

    app: Doc
    deployment: Doc


def serve_config_problems(
    text: Any, names: ServeNames, cluster: Doc, problems: list[str]
) -> ServeApp | None:
    """Ray Serve's config, checked by Ray's own schema; None (and a problem) if it is not one."""
    # serveConfigV2 "should be a YAML multi-line scalar string" (SERVICE_TYPES).
    if not isinstance(text, str):
        problems.append("spec.serveConfigV2 must be a YAML string")
        return None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as error:
        problems.append(f"spec.serveConfigV2 is not YAML: {error}")
        return None
    from pydantic import ValidationError

    try:
        serve_deploy_schema().model_validate(config)
    except ValidationError as error:
        problems.append(f"spec.serveConfigV2 is not a Ray Serve config: {error}")
        return None
    # KubeRay marks a RayService Ready only while its Serve service has endpoints, pods
    # with a running Serve proxy (calculateConditions in CONTROLLER): vaecast needs
    # none, but one must run.
    if config.get("proxy_location") == "Disabled":
        problems.append("serveConfigV2: proxy_location Disabled leaves the RayService never Ready")
    apps = {app["name"]: app for app in config["applications"]}
    app = apps.get(names.app)
    if app is None:
        problems.append(f"serveConfigV2 has no application named {names.app!r} (vaecast's)")
        return None
    if app.get("import_path") != names.import_path:
        problems.append(
            f"serveConfigV2's import_path {app.get('import_path')!r} is not {names.import_path!r}"
        )
    for model, path in (app.get("args") or {}).get("weights", {}).items():
        if not any(path.startswith(m + "/") for m in gpu_mounts(cluster)):
            problems.append(f"serveConfigV2: {model}'s weights {path} are on no GPU pod's volume")
    deployments = {d["name"]: d for d in app.get("deployments", [])}
    if names.deployment not in deployments:
        problems.append(f"serveConfigV2's application has no deployment named {names.deployment!r}")
        return None
    deployment = deployments[names.deployment]
    # A replica sizes its decode and encode threads from its args; Serve sends it
    # max_ongoing_requests jobs at once.
    threads = (app.get("args") or {}).get("max_ongoing")
    if threads != deployment.get("max_ongoing_requests"):
        problems.append(
            f"serveConfigV2: args.max_ongoing {threads} is not the deployment's "
            f"max_ongoing_requests {deployment.get('max_ongoing_requests')}"
        )
    return ServeApp(app, deployment)


def serve_deploy_schema() -> Any:
    with warnings.catch_warnings():
        # Ray Serve's schema module still uses pydantic v1 idioms, and pydantic 2 warns
        # about them once, at import; nothing here uses them.
        warnings.simplefilter("ignore", DeprecationWarning)
        from ray.serve.schema import ServeDeploySchema
    return ServeDeploySchema


def gpu_mounts(cluster: Doc) -> set[str]:
    """Where the GPU pods' volumes are mounted (the replicas read weights there)."""
    return {
        mount["mountPath"].rstrip("/")
        for group in cluster.get("workerGroupSpecs", [])
        for container in group["template"]["spec"]["containers"]
        if container_gpus(container)
        for mount in container.get("volumeMounts", [])
    }


def container_gpus(container: Doc) -> int:
    # GPU_GUIDE: a pod gets GPUs from nvidia.com/gpu in its limits; KubeRay passes that
    # count to `ray start --num-gpus`.
    return int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))


def gpu_problems(deployment: Doc, names: ServeNames, cluster: Doc) -> list[str]:
    per_replica = deployment.get("ray_actor_options", {}).get("num_gpus", 0)
    if not per_replica:
        return []
    scaling = deployment.get("autoscaling_config") or {}
    wanted = scaling.get("max_replicas", deployment.get("num_replicas", 1))
    at_least = scaling.get("min_replicas", deployment.get("num_replicas", 1))
    most = least = 0
    for group in cluster.get("workerGroupSpecs", []):
        gpus = container_gpus(group["template"]["spec"]["containers"][0])
        # A replica lives on one node: a pod fits gpus // per_replica of them.
        fits = int(gpus // per_replica)
        most += fits * group["maxReplicas"]
        least += fits * group["minReplicas"]
    problems = []
    if most < wanted:
        problems.append(
            f"the GPU worker groups hold at most {most} replicas of {per_replica} GPU, "
            f"the deployment {names.deployment!r} scales to {wanted}"
        )
    if least < at_least:
        problems.append(
            f"the GPU worker groups' minReplicas hold {least} replicas, "
            f"the deployment's minimum is {at_least}"
        )
    return problems


def all_containers(cluster: Doc) -> Iterator[Doc]:
    yield from cluster["headGroupSpec"]["template"]["spec"]["containers"]
    for group in cluster.get("workerGroupSpecs", []):
        yield from group["template"]["spec"]["containers"]


def image_problems(cluster: Doc) -> list[str]:
    images = {c["image"] for c in all_containers(cluster)}
    problems = []
    if len(images) != 1:
        problems.append(f"every pod runs one vaecast image, found {sorted(images)}")
    # "rayVersion ... should match the Ray version in the image of the containers"
    # (SAMPLE): the image is deploy/Dockerfile's.
    base = re.search(r"^FROM rayproject/ray:(\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    version = cluster.get("rayVersion", "")
    if base is None or not base.group(1).startswith(version + "-"):
        problems.append(f"deploy/Dockerfile's Ray image is not rayVersion {version}")
    if any(version not in image for image in images):
        problems.append(f"the image tags do not name rayVersion {version}")
    return problems


def command_problems(rayservice: Doc) -> list[str]:
    """POD_COMMAND: with the overwrite annotation (copied from a RayService to its
    RayCluster: constructRayClusterForRayService in CONTROLLER) each Ray container runs
    its own command, and must start Ray itself from $KUBERAY_GEN_RAY_START_CMD."""
    annotations = rayservice.get("metadata", {}).get("annotations", {})
    if annotations.get(OVERWRITE_CMD) != "true":
        return []
    cluster = rayservice["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster.get("workerGroupSpecs", [])]
    return [
        f"{group.get('groupName', 'head')}: with {OVERWRITE_CMD} its Ray container must run "
        f"${GEN_CMD}"
        for group in groups
        if GEN_CMD not in " ".join(group["template"]["spec"]["containers"][0].get("args", []))
    ]


def frontend_group(cluster: Doc) -> Doc | None:
    for group in cluster.get("workerGroupSpecs", []):
        args = " ".join(group["template"]["spec"]["containers"][0].get("args", []))
        if "vaecast serve" in args:
            return group
    return None


def frontend_problems(cluster: Doc, service: Doc, serve: ServeApp | None) -> list[str]:
    group = frontend_group(cluster)
    if group is None:
        return ["no worker group runs `vaecast serve` (the front ends)"]
    name = group["groupName"]
    problems = []
    # A front end's node offers no CPU, so that no replica (which needs CPUs) is placed
    # on it: front ends come and go with their pods.
    if group["rayStartParams"].get("num-cpus") != "0":
        problems.append(f'{name}: rayStartParams num-cpus must be "0"')
    container = group["template"]["spec"]["containers"][0]
    argv = vaecast_argv(container)
    problems += serve_argv_problems(name, argv, serve)
    for path in _weights(argv).values():
        mounts = {m["mountPath"].rstrip("/") for m in container.get("volumeMounts", [])}
        if not any(path.startswith(m + "/") for m in mounts):
            problems.append(f"{name}: --weights {path} is on no volume of the front end")
    port = _option(argv, "--port")
    ports = {p.get("name"): p.get("containerPort") for p in container.get("ports", [])}
    if port is None or int(port) not in ports.values():
        problems.append(f"{name}: vaecast's --port {port} is not a containerPort")
    elif int(port) in RAY_PORTS:
        problems.append(f"{name}: vaecast's --port {port} is one Ray uses")
    for probe in ("readinessProbe", "livenessProbe"):
        get = container.get(probe, {}).get("httpGet", {})
        probed = ports.get(get.get("port"), get.get("port"))  # a port's name or number
        if get.get("path") != "/healthz" or port is None or probed != int(port):
            problems.append(f"{name}: {probe} must GET /healthz on vaecast's port")
    env = {e["name"]: e for e in container.get("env", [])}
    key = env.get(API_KEY_ENV, {})
    if "secretKeyRef" not in key.get("valueFrom", {}) or "value" in key:
        problems.append(f"{name}: {API_KEY_ENV} must come from a Secret (valueFrom.secretKeyRef)")
    problems += service_problems(service, group, ports, cluster)
    return problems


def vaecast_argv(container: Doc) -> list[str]:
    """The `vaecast serve` arguments of the container's shell line."""
    line = " ".join(container.get("args", []))
    command = line.split("vaecast serve", 1)[1] if "vaecast serve" in line else ""
    return shlex.split(command)


def _option(argv: list[str], name: str) -> str | None:
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == name]
    return values[-1] if values else None


def _weights(argv: list[str]) -> dict[str, str]:
    specs = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--weights"]
    return dict(spec.split("=", 1) for spec in specs if "=" in spec)


def serve_argv_problems(name: str, argv: list[str], serve: ServeApp | None) -> list[str]:
    """vaecast's own parser judges the arguments (a typo fails here, not in the pod)."""
    from vaecast.cli import _parser

    try:
        args = _parser().parse_args(["serve", *argv])
    except SystemExit:
        return [f"{name}: `vaecast serve {shlex.join(argv)}` is refused by vaecast's parser"]
    problems = []
    if args.ray != "auto":  # the pod's own Ray node, started just before
        problems.append(f"{name}: the front end must run with --ray auto")
    if ipaddress.ip_address(args.host) != ipaddress.ip_address("0.0.0.0"):
        problems.append(f"{name}: the front end must listen with --host 0.0.0.0")
    if not args.allowed_host:  # names clients use; addresses are answered beyond loopback
        problems.append(f"{name}: list the Service's host names with --allowed-host")
    if serve is not None:
        problems += replica_flag_problems(name, args, serve)
    return problems


def replica_flag_problems(name: str, args: Any, serve: ServeApp) -> list[str]:
    """A front end's replica flags say what serveConfigV2 deploys: they size its
    admission (replicas x max-ongoing jobs at once), and a front end that comes up
    before KubeRay has submitted the config deploys the replicas from them."""
    deployment, app_args = serve.deployment, serve.app.get("args") or {}
    scaling = deployment.get("autoscaling_config") or {}
    options = deployment.get("ray_actor_options") or {}
    wanted = {
        "--replicas": scaling.get("min_replicas", deployment.get("num_replicas", 1)),
        "--max-replicas": scaling.get("max_replicas"),
        "--max-ongoing": deployment.get("max_ongoing_requests"),
        "--replica-gpus": options.get("num_gpus", 0),
        "--replica-cpus": options.get("num_cpus", 1),
        "--replica-models": list(app_args.get("models", [])),
        "--weights": dict(app_args.get("weights") or {}),
    }
    given = {
        "--replicas": args.replicas,
        "--max-replicas": args.max_replicas,
        "--max-ongoing": args.max_ongoing,
        "--replica-gpus": args.replica_gpus,
        "--replica-cpus": args.replica_cpus,
        "--replica-models": args.replica_models or args.model,
        "--weights": dict(spec.split("=", 1) for spec in args.weights if "=" in spec),
    }
    return [
        f"{name}: {flag} {given[flag]} is not serveConfigV2's {wanted[flag]}"
        for flag in wanted
        if given[flag] != wanted[flag]
    ]


def service_problems(service: Doc, frontend: Doc, ports: dict[str, int], cluster: Doc) -> list[str]:
    problems = []
    spec = service.get("spec", {})
    if service.get("apiVersion") != "v1" or spec.get("type", "ClusterIP") not in K8S_SERVICE_TYPES:
        problems.append("the Service must be a v1 ClusterIP, NodePort or LoadBalancer Service")
    selector = spec.get("selector") or {}

    def selects(group: Doc) -> bool:
        labels = group["template"].get("metadata", {}).get("labels", {})
        return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

    if not selects(frontend):
        problems.append("the Service's selector does not match the front ends' pod labels")
    others = [cluster["headGroupSpec"], *cluster.get("workerGroupSpecs", [])]
    if any(selects(group) for group in others if group is not frontend):
        problems.append("the Service's selector also matches pods that are not front ends")
    for port in spec.get("ports", []):
        target = port.get("targetPort", port.get("port"))
        if target not in ports and target not in ports.values():
            problems.append(f"the Service's targetPort {target!r} is no front-end port")
    return problems


# ---------------------------------------------------------------------------
# The manifest passes


@pytest.fixture(scope="module")
def names() -> ServeNames:
    return vaecast_serve_names()


def test_the_manifest_passes_every_rule(names: ServeNames) -> None:
    assert manifest_problems(load(), names) == []


def test_the_builder_makes_vaecasts_deployment_from_the_manifests_args(names: ServeNames) -> None:
    """What Serve does with import_path and args on the cluster, short of running it."""
    import importlib

    from ray import serve

    config = yaml.safe_load(load()[0]["spec"]["serveConfigV2"])
    app = next(a for a in config["applications"] if a["name"] == names.app)
    module, _, attribute = names.import_path.partition(":")
    built = getattr(importlib.import_module(module), attribute)(app["args"])
    assert isinstance(built, serve.Application)
    # Serve has no public accessor for an application's deployment; a config naming a
    # deployment the application lacks is refused on the cluster.
    assert built._bound_deployment.name == names.deployment


def test_the_front_end_line_starts_ray_without_block_then_vaecast(tmp_path: Path) -> None:
    """The container's shell line, run by bash as the pod would run it, with `ray` and
    `vaecast` replaced by scripts that record their arguments."""
    group = frontend_group(load()[0]["spec"]["rayClusterConfig"])
    assert group is not None
    container = group["template"]["spec"]["containers"][0]
    record = tmp_path / "calls"
    for tool in ("ray", "vaecast"):
        stub = tmp_path / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{record}"\n')
        stub.chmod(0o755)
    # KubeRay's own command for Ray containers (POD_COMMAND). Run here without -l: a
    # login shell's /etc/profile resets PATH, and with it the stubs.
    assert container["command"] == ["/bin/bash", "-lc", "--"]
    generated = (
        "ray start --address=vaecast-head-svc:6379 --num-cpus=0 --block --metrics-export-port=8080"
    )
    env = {
        **os.environ,
        "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
        GEN_CMD: generated,
    }
    subprocess.run(["/bin/bash", "-c", "--", *container["args"]], env=env, check=True, timeout=30)
    calls = record.read_text().splitlines()
    assert len(calls) == 2
    assert shlex.split(calls[0]) == shlex.split(generated.replace("--block", ""))
    assert shlex.split(calls[1]) == ["vaecast", "serve", *vaecast_argv(container)]


# ---------------------------------------------------------------------------
# The checker rejects broken copies

Mutation = Callable[[Doc, Doc], None]


def _cluster(rayservice: Doc) -> Doc:
    return rayservice["spec"]["rayClusterConfig"]


def _gpu(rayservice: Doc) -> Doc:
    return _cluster(rayservice)["workerGroupSpecs"][0]


def _front(rayservice: Doc) -> Doc:
    group = frontend_group(_cluster(rayservice))
    assert group is not None
    return group


def _front_args(rayservice: Doc, old: str, new: str) -> None:
    container = _front(rayservice)["template"]["spec"]["containers"][0]
    assert old in container["args"][0]
    container["args"][0] = container["args"][0].replace(old, new)


def _move_front_port(rayservice: Doc, port: int) -> None:
    container = _front(rayservice)["template"]["spec"]["containers"][0]
    _front_args(rayservice, "--port 8100", f"--port {port}")
    container["ports"][0]["containerPort"] = port


def _serve(rayservice: Doc, edit: Callable[[Doc], None]) -> None:
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    edit(config)
    rayservice["spec"]["serveConfigV2"] = yaml.safe_dump(config)


BROKEN: dict[str, tuple[Mutation, str]] = {
    "no groupName": (lambda r, s: _gpu(r).pop("groupName"), "groupName is required"),
    "misspelt field": (
        lambda r, s: _cluster(r).__setitem__(
            "workerGroupSpec", _cluster(r).pop("workerGroupSpecs")
        ),
        "workerGroupSpec is an unknown field",
    ),
    "two groups, one name": (
        lambda r, s: _front(r).__setitem__("groupName", _gpu(r)["groupName"]),
        "must be unique",
    ),
    "min above max": (lambda r, s: _gpu(r).__setitem__("minReplicas", 9), "not 0 <= min <= max"),
    "a number in rayStartParams": (
        lambda r, s: _front(r)["rayStartParams"].__setitem__("num-cpus", 0),
        "num-cpus must be a string",
    ),
    "no head container": (
        lambda r, s: _cluster(r)["headGroupSpec"]["template"]["spec"].__setitem__("containers", []),
        "at least one container",
    ),
    "a long name": (
        lambda r, s: r["metadata"].__setitem__("name", "v" * 48),
        "DNS-1035 label",
    ),
    "serveConfigV2 not YAML": (
        lambda r, s: r["spec"].__setitem__("serveConfigV2", "applications: [\n"),
        "is not YAML",
    ),
    "serveConfigV2 not a Serve config": (
        lambda r, s: _serve(r, lambda c: c["applications"][0].pop("import_path")),
        "not a Ray Serve config",
    ),
    "no Serve proxy": (
        lambda r, s: _serve(r, lambda c: c.__setitem__("proxy_location", "Disabled")),
        "never Ready",
    ),
    "weights off the volume": (
        lambda r, s: _serve(
            r, lambda c: c["applications"][0]["args"]["weights"].__setitem__("taehv", "/w.pt")
        ),
        "on no GPU pod's volume",
    ),
    "replica threads unlike Serve's limit": (
        lambda r, s: _serve(
            r, lambda c: c["applications"][0]["args"].__setitem__("max_ongoing", 1)
        ),
        "args.max_ongoing 1",
    ),
    "another deployment name": (
        lambda r, s: _serve(
            r, lambda c: c["applications"][0]["deployments"][0].__setitem__("name", "X")
        ),
        "no deployment named",
    ),
    "more GPUs per replica than a pod has": (
        lambda r, s: _serve(
            r,
            lambda c: c["applications"][0]["deployments"][0]["ray_actor_options"].__setitem__(
                "num_gpus", 2
            ),
        ),
        "hold at most 0 replicas",
    ),
    "a Ray container that does not start Ray": (
        lambda r, s: _gpu(r)["template"]["spec"]["containers"][0].__setitem__("args", ["sleep 1"]),
        f"must run ${GEN_CMD}",
    ),
    "a front end on a CPU-offering node": (
        lambda r, s: _front(r)["rayStartParams"].__setitem__("num-cpus", "1"),
        'num-cpus must be "0"',
    ),
    "a front end outside the cluster": (
        lambda r, s: _front_args(r, "--ray auto", "--ray local"),
        "--ray auto",
    ),
    "front-end flags that disagree with serveConfigV2": (
        lambda r, s: _front_args(r, "--max-ongoing 2", "--max-ongoing 3"),
        "--max-ongoing 3 is not serveConfigV2's 2",
    ),
    "front-end weights on no volume": (
        lambda r, s: _front(r)["template"]["spec"]["containers"][0].pop("volumeMounts"),
        "is on no volume of the front end",
    ),
    "an option vaecast does not have": (
        lambda r, s: _front_args(r, "--shutdown-grace", "--shutdown-grcae"),
        "refused by vaecast's parser",
    ),
    "a front end on loopback": (
        lambda r, s: _front_args(r, "--host 0.0.0.0", "--host 127.0.0.1"),
        "--host 0.0.0.0",
    ),
    "vaecast on a port it does not expose": (
        lambda r, s: _front_args(r, "--port 8100", "--port 8101"),
        "is not a containerPort",
    ),
    "vaecast on Serve's port": (lambda r, s: _move_front_port(r, 8000), "is one Ray uses"),
    "the API key in clear": (
        lambda r, s: _front(r)["template"]["spec"]["containers"][0].__setitem__(
            "env", [{"name": API_KEY_ENV, "value": "hunter2"}]
        ),
        "must come from a Secret",
    ),
    "a Service that selects nothing": (
        lambda r, s: s["spec"].__setitem__("selector", {"app": "nothing"}),
        "does not match the front ends",
    ),
    "a Service to a port nobody has": (
        lambda r, s: s["spec"]["ports"][0].__setitem__("targetPort", "web"),
        "targetPort 'web'",
    ),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_copy_is_rejected(broken: str, names: ServeNames) -> None:
    docs = copy.deepcopy(load())
    mutate, expected = BROKEN[broken]
    mutate(docs[0], docs[1])
    problems = manifest_problems(docs, names)
    assert any(expected in problem for problem in problems), problems
