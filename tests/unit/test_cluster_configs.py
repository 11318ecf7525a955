"""The cluster configs users deploy: cluster/aws.yaml, cluster/gcp.yaml, cluster/kuberay/*.yaml, cluster/Dockerfile.

Fast and offline: no cloud SDK, no Kubernetes, no Docker. The launcher configs go through Ray's own
checks, the ones `ray up` runs before it calls a cloud API (``prepare_config`` merges the provider's
defaults.yaml; ``validate_config`` checks the result against ray/autoscaler/ray-schema.json), with
the network refused. rayemb's own requirements (GPU workers from zero, token auth from a file or a
Secret, the shared mount, the image, an NVIDIA driver that runs the GPU lock's CUDA, S3 access on
AWS) are checked by the ``*_problems`` functions below, which list what is wrong; every check is
also run on broken copies to show that it can fail.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
import shlex
import socket
import tomllib
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
KUBERAY = CLUSTER / "kuberay"
LOCK = ROOT / "requirements" / "lock-cpu.txt"
GPU_LOCK = ROOT / "requirements" / "lock-gpu.txt"
LAUNCHER_CONFIGS = ["aws.yaml", "gcp.yaml"]
SHARED = "/mnt/shared"
PVC_NAME = "rayemb-shared"
#: a hard-coded token would look like this (`openssl rand -hex 32` makes 64 hex characters)
HEX_TOKEN = re.compile(r"\b[0-9a-fA-F]{32,}\b")


def locked_version(name: str) -> str:
    m = re.search(rf"^{re.escape(name)}==(\S+)$", LOCK.read_text(), re.M)
    assert m, f"{name} is not pinned in {LOCK}"
    return m.group(1)


class NetworkUsed(BaseException):
    """Raised on any connection attempt; a BaseException, so no ``except Exception`` in Ray swallows it."""


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise NetworkUsed(f"network access while checking a config: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_no_network_fixture_refuses_connections(no_network):
    with pytest.raises(NetworkUsed):
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    with pytest.raises(NetworkUsed):
        socket.socket().connect(("127.0.0.1", 9))


# --------------------------------------------------------------------------------------------- #
# Ray cluster launcher configs
# --------------------------------------------------------------------------------------------- #


def load_launcher(name: str) -> Dict[str, Any]:
    return yaml.safe_load((CLUSTER / name).read_text())


def ray_validate(config: Dict[str, Any]) -> Dict[str, Any]:
    """What `ray up` does to a config before any cloud call (ray.autoscaler._private.commands._bootstrap_config)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def _resources(node_type: Dict[str, Any]) -> Dict[str, Any]:
    return node_type.get("resources") or {}


def launcher_problems(config: Dict[str, Any]) -> List[str]:
    """rayemb's requirements on a launcher config, as a list of what is wrong (empty: fine)."""
    problems: List[str] = []
    types = config.get("available_node_types") or {}
    head_name = config.get("head_node_type")
    head = types.get(head_name, {})
    if _resources(head).get("GPU", 0):
        problems.append(f"head node type {head_name} has GPUs: the head is a CPU node")
    for name, t in types.items():
        if not _resources(t).get("CPU"):
            problems.append(f"node type {name} states no CPU resources")
    gpu_types = {n: t for n, t in types.items() if n != head_name and _resources(t).get("GPU", 0) >= 1}
    if not gpu_types:
        problems.append("no GPU worker node type (resources with GPU >= 1)")
    for name, t in gpu_types.items():
        if "min_workers" not in t or t["min_workers"] != 0:
            problems.append(f"GPU node type {name}: min_workers must be 0 (scaled up on demand), not {t.get('min_workers')!r}")
        if t.get("max_workers", 0) < 1:
            problems.append(f"GPU node type {name}: max_workers must be >= 1")

    docker = config.get("docker") or {}
    if "rayemb" not in str(docker.get("image", "")):
        problems.append(f"docker.image {docker.get('image')!r} is not a rayemb image")
    if not docker.get("container_name"):
        problems.append("docker.container_name is not set")
    if f"--volume {SHARED}:{SHARED}" not in docker.get("run_options", []):
        problems.append(f"docker.run_options do not mount the host's {SHARED} into the container")

    init = " ".join(config.get("initialization_commands") or [])
    if not re.search(rf"\bmount\b.*\s{re.escape(SHARED)}(\s|;|$)", init):
        problems.append(f"initialization_commands do not mount the shared file system at {SHARED}")
    if "setup_commands" not in config:
        problems.append("setup_commands is not set: Ray's default (pip-install a nightly Ray) would run")

    mount_dests = [d.rstrip("/") for d in (config.get("file_mounts") or {})]
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        cmds = config.get(key) or []
        text = " ".join(cmds)
        if "RAY_AUTH_MODE=token" not in text:
            problems.append(f"{key}: token authentication is not on (RAY_AUTH_MODE=token)")
        paths = re.findall(r"RAY_AUTH_TOKEN_PATH=(\S+)", text)
        if not paths:
            problems.append(f"{key}: no RAY_AUTH_TOKEN_PATH (the token must come from a file)")
        for p in paths:
            p = p.replace("$HOME/", "~/")
            if not any(p.startswith(d + "/") for d in mount_dests):
                problems.append(f"{key}: token file {p} is not under a file_mounts destination {mount_dests}")
        if re.search(r"RAY_AUTH_TOKEN=", text):
            problems.append(f"{key}: RAY_AUTH_TOKEN is set in a command (a hard-coded token)")
        if f"RAYEMB_WORKSPACE={SHARED}" not in text:
            problems.append(f"{key}: RAYEMB_WORKSPACE={SHARED} is not set")
        start = [i for i, c in enumerate(cmds) if "ray start" in c]
        if len(start) != 1:
            problems.append(f"{key}: expected one `ray start` command, found {len(start)}")
        for i, c in enumerate(cmds):
            if "ray stop" in c and (c.strip() != "ray stop" or not start or i > start[0]):
                problems.append(f"{key}: `ray stop` only as the plain command before `ray start`, not {c!r}")
    if HEX_TOKEN.search(json.dumps(config)):
        problems.append("a token-like hex string is written in the config")
    return problems


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_launcher_config_passes_rays_own_validation(name, no_network):
    prepared = ray_validate(load_launcher(name))
    # prepare_config merged the provider's defaults.yaml underneath: none of its commands leaked in
    assert "ray-wheels" not in json.dumps(prepared)
    assert prepared["setup_commands"] == []
    assert all(t["max_workers"] >= t["min_workers"] for t in prepared["available_node_types"].values())


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_launcher_config_meets_rayemb_requirements(name):
    assert launcher_problems(load_launcher(name)) == []
    text = (CLUSTER / name).read_text()
    assert not HEX_TOKEN.search(text), "a token-like hex string in the file (comments included)"
    assert "REPLACE_ME" in load_launcher(name)["docker"]["image"], "the image should be an obvious placeholder"


def _gpu_type(config: Dict[str, Any]) -> Dict[str, Any]:
    return next(t for n, t in config["available_node_types"].items()
                if n != config["head_node_type"] and t["resources"].get("GPU", 0) >= 1)


# Each breaks the config the way a hand edit could; Ray's checks must refuse it.
RAY_REJECTS = {
    "GPU type without resources": lambda c: _gpu_type(c).pop("resources"),
    "min_workers as a string": lambda c: _gpu_type(c).__setitem__("min_workers", "0"),
    "negative GPU count": lambda c: _gpu_type(c)["resources"].__setitem__("GPU", -1),
    "misspelled docker key": lambda c: c["docker"].__setitem__("imgae", "rayemb:latest"),
    "unknown top-level key": lambda c: c.__setitem__("worker_nodes_typo", {}),
    "head_node_type not defined": lambda c: c.__setitem__("head_node_type", "no.such.type"),
    "docker image without container name": lambda c: c["docker"].pop("container_name"),
}


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
@pytest.mark.parametrize("breakage", sorted(RAY_REJECTS))
def test_rays_validation_rejects_a_broken_config(name, breakage, no_network):
    import jsonschema

    config = load_launcher(name)
    RAY_REJECTS[breakage](config)
    with pytest.raises((jsonschema.ValidationError, ValueError, AssertionError)):
        ray_validate(config)


OWN_REJECTS = {
    "GPU workers kept up": (lambda c: _gpu_type(c).__setitem__("min_workers", 1), "min_workers must be 0"),
    "no GPU type": (lambda c: _gpu_type(c)["resources"].pop("GPU"), "no GPU worker node type"),
    "GPU head": (lambda c: c["available_node_types"][c["head_node_type"]]["resources"].__setitem__("GPU", 1),
                 "head node type"),
    "auth off on workers": (lambda c: c.__setitem__("worker_start_ray_commands", [
        x.replace("RAY_AUTH_MODE=token", "RAY_AUTH_MODE=disabled") for x in c["worker_start_ray_commands"]]),
        "token authentication is not on"),
    "hard-coded token": (lambda c: c["head_start_ray_commands"].__setitem__(
        1, "export RAY_AUTH_TOKEN=" + "ab" * 32 + "; " + c["head_start_ray_commands"][1]), "hard-coded"),
    "token file not copied": (lambda c: c.__setitem__("file_mounts", {}), "not under a file_mounts destination"),
    "no shared volume in container": (lambda c: c["docker"].__setitem__("run_options", []), "run_options"),
    "no shared mount on hosts": (lambda c: c.__setitem__("initialization_commands", []), "mount the shared"),
    "Ray's default setup": (lambda c: c.pop("setup_commands"), "setup_commands"),
    "ray stop after start": (lambda c: c["worker_start_ray_commands"].append("ray stop"), "`ray stop`"),
    "not our image": (lambda c: c["docker"].__setitem__("image", "rayproject/ray:latest-gpu"), "not a rayemb image"),
}


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
@pytest.mark.parametrize("breakage", sorted(OWN_REJECTS))
def test_rayemb_requirements_catch_a_broken_launcher_config(name, breakage):
    config = load_launcher(name)
    mutate, expected = OWN_REJECTS[breakage]
    mutate(config)
    problems = launcher_problems(config)
    assert any(expected in p for p in problems), problems


# --------------------------------------------------------------------------------------------- #
# KubeRay manifests
# --------------------------------------------------------------------------------------------- #


def load_docs(name: str) -> List[Dict[str, Any]]:
    return [d for d in yaml.safe_load_all((KUBERAY / name).read_text()) if d]


def the_doc(name: str, kind: str) -> Dict[str, Any]:
    docs = [d for d in load_docs(name) if d.get("kind") == kind]
    assert len(docs) == 1, f"{name}: expected one {kind}, found {len(docs)}"
    return docs[0]


def _pod_problems(where: str, template: Dict[str, Any], secret: str) -> List[str]:
    problems: List[str] = []
    spec = (template or {}).get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        return [f"{where}: template.spec.containers is empty"]
    for c in containers:
        image = c.get("image")
        if not isinstance(image, str) or not image.strip() or any(ch.isspace() for ch in image):
            problems.append(f"{where}/{c.get('name')}: image {image!r} is not set")
    ray = containers[0]  # KubeRay's Ray container is the first one
    env = ray.get("env") or []
    names = [e.get("name") for e in env]
    if len(names) != len(set(names)):
        problems.append(f"{where}: duplicate env names {names}")
    by_name = {e.get("name"): e for e in env}
    if (by_name.get("RAY_AUTH_MODE") or {}).get("value") != "token":
        problems.append(f"{where}: RAY_AUTH_MODE is not token")
    tok = by_name.get("RAY_AUTH_TOKEN") or {}
    ref = ((tok.get("valueFrom") or {}).get("secretKeyRef")) or {}
    if "value" in tok or ref.get("name") != secret or ref.get("key") != "auth_token":
        problems.append(f"{where}: RAY_AUTH_TOKEN must come from Secret {secret!r} key auth_token, not {tok!r}")
    if (by_name.get("RAYEMB_WORKSPACE") or {}).get("value") != SHARED:
        problems.append(f"{where}: RAYEMB_WORKSPACE is not {SHARED}")
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    shared = [n for n, v in volumes.items() if (v.get("persistentVolumeClaim") or {}).get("claimName") == PVC_NAME]
    mounts = {m.get("name"): m.get("mountPath") for m in ray.get("volumeMounts") or []}
    if not shared or mounts.get(shared[0]) != SHARED:
        problems.append(f"{where}: the PVC {PVC_NAME} is not mounted at {SHARED}")
    for m in mounts:
        if m not in volumes:
            problems.append(f"{where}: volumeMount {m} has no volume")
    return problems


def _gpu_limit(group: Dict[str, Any]) -> int:
    c = (((group.get("template") or {}).get("spec") or {}).get("containers") or [{}])[0]
    return int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))


def raycluster_spec_problems(spec: Dict[str, Any]) -> List[str]:
    """rayemb's and KubeRay's requirements on a RayCluster spec (also a RayJob's rayClusterSpec)."""
    problems: List[str] = []
    if spec.get("enableInTreeAutoscaling") is not True:
        problems.append("enableInTreeAutoscaling is not true")
    if str(spec.get("rayVersion")) != locked_version("ray"):
        problems.append(f"rayVersion {spec.get('rayVersion')!r} is not the locked Ray {locked_version('ray')}")
    auth = spec.get("authOptions") or {}
    secret = auth.get("secretName")
    if auth.get("mode") != "token" or not secret:
        problems.append(f"authOptions {auth!r}: token mode with a secretName is required")
    head = spec.get("headGroupSpec")
    groups = spec.get("workerGroupSpecs")
    if not isinstance(head, dict):
        return problems + ["headGroupSpec is missing"]
    if not isinstance(groups, list) or not groups:
        return problems + ["workerGroupSpecs is missing or empty"]
    for where, params in [("headGroupSpec", head.get("rayStartParams"))] + [
            (f"workerGroupSpecs[{g.get('groupName')}]", g.get("rayStartParams")) for g in groups]:
        if not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values()):
            problems.append(f"{where}.rayStartParams must be a mapping of strings, not {params!r}")
    problems += _pod_problems("headGroupSpec", head.get("template"), secret)
    if _gpu_limit(head):
        problems.append("the head asks for GPUs: it is a CPU pod")
    for g in groups:
        where = f"workerGroupSpecs[{g.get('groupName')}]"
        for key in ("groupName", "minReplicas", "maxReplicas", "rayStartParams", "template"):
            if key not in g:
                problems.append(f"{where}: {key} is missing")
        lo, hi = g.get("minReplicas", 0), g.get("maxReplicas", 0)
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= g.get("replicas", lo) <= hi and hi >= 1):
            problems.append(f"{where}: needs 0 <= minReplicas <= replicas <= maxReplicas, maxReplicas >= 1")
        problems += _pod_problems(where, g.get("template"), secret)
        c = (((g.get("template") or {}).get("spec") or {}).get("containers") or [{}])[0]
        res = c.get("resources") or {}
        if "nvidia.com/gpu" in (res.get("requests") or {}) and \
                str(res["requests"]["nvidia.com/gpu"]) != str((res.get("limits") or {}).get("nvidia.com/gpu")):
            problems.append(f"{where}: nvidia.com/gpu requests must equal limits")
    gpu_groups = [g for g in groups if _gpu_limit(g) >= 1]
    if not gpu_groups:
        problems.append("no worker group with an nvidia.com/gpu limit")
    for g in gpu_groups:
        if g.get("minReplicas") != 0:
            problems.append(f"GPU group {g.get('groupName')}: minReplicas must be 0, not {g.get('minReplicas')!r}")
    return problems


def _check_manifest_header(doc: Dict[str, Any], kind: str) -> None:
    assert doc["apiVersion"] == "ray.io/v1"
    assert doc["kind"] == kind
    assert doc["metadata"]["name"]


def test_raycluster_manifest():
    rc = the_doc("raycluster.yaml", "RayCluster")
    _check_manifest_header(rc, "RayCluster")
    assert raycluster_spec_problems(rc["spec"]) == []
    assert all(g["replicas"] == 0 for g in rc["spec"]["workerGroupSpecs"] if _gpu_limit(g))


def test_rayjob_manifest():
    job = the_doc("rayjob.yaml", "RayJob")
    _check_manifest_header(job, "RayJob")
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert raycluster_spec_problems(spec["rayClusterSpec"]) == []


def test_rayjob_entrypoint_runs_train_py_on_the_image_with_outputs_on_the_shared_volume():
    from rayemb.config import load_config

    entry = the_doc("rayjob.yaml", "RayJob")["spec"]["entrypoint"]
    assert not re.search(r"&&|\|\||[;|<>`]|\$\(", entry), "keep the entrypoint one command, no shell operators"
    argv = shlex.split(entry)
    assert argv[0] == "python" and argv[1].endswith("jobs/train.py")
    workdir = dockerfile_workdir(DOCKERFILE.read_text())
    in_repo = lambda p: ROOT / Path(p).relative_to(workdir)  # noqa: E731
    assert in_repo(argv[1]).is_file()
    config = argv[argv.index("--config") + 1]
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    # rayemb itself accepts the config and every override
    cfg = load_config(str(in_repo(config)), overrides)
    assert cfg.tracking.output_dir.startswith(SHARED + "/") and cfg.data.path.startswith(SHARED + "/")
    assert cfg.scaling.use_gpu is True


def test_kuberay_manifests_agree_with_each_other_and_the_volume_claim():
    pvc = the_doc("shared-storage.yaml", "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == PVC_NAME and "ReadWriteMany" in pvc["spec"]["accessModes"]
    rc = the_doc("raycluster.yaml", "RayCluster")["spec"]
    rj = the_doc("rayjob.yaml", "RayJob")["spec"]["rayClusterSpec"]

    def images(spec):
        pods = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
        return {c["image"] for p in pods for c in p["spec"]["containers"]}

    assert images(rc) == images(rj) and len(images(rc)) == 1
    assert "REPLACE_ME" in next(iter(images(rc))), "the image should be an obvious placeholder"
    assert rc["authOptions"] == rj["authOptions"]
    for name in ("raycluster.yaml", "rayjob.yaml", "shared-storage.yaml"):
        assert not HEX_TOKEN.search((KUBERAY / name).read_text()), f"{name}: a token-like hex string"


def _gpu_group(spec):
    return next(g for g in spec["workerGroupSpecs"] if _gpu_limit(g))


def _ray_container(pod_template):
    return pod_template["spec"]["containers"][0]


KUBERAY_REJECTS = {
    "no autoscaler": (lambda s: s.__setitem__("enableInTreeAutoscaling", False), "enableInTreeAutoscaling"),
    "GPU pods kept up": (lambda s: _gpu_group(s).__setitem__("minReplicas", 1), "minReplicas must be 0"),
    "no GPU limit": (lambda s: [_ray_container(g["template"])["resources"]["limits"].pop("nvidia.com/gpu", None)
                                for g in s["workerGroupSpecs"]], "no worker group with an nvidia.com/gpu"),
    "no maxReplicas": (lambda s: _gpu_group(s).pop("maxReplicas"), "maxReplicas is missing"),
    "no image": (lambda s: _ray_container(s["headGroupSpec"]["template"]).pop("image"), "image None"),
    "token in the manifest": (lambda s: [e.update(value="ab" * 32) or e.pop("valueFrom")
                                         for e in _ray_container(_gpu_group(s)["template"])["env"]
                                         if e["name"] == "RAY_AUTH_TOKEN"], "RAY_AUTH_TOKEN must come from Secret"),
    "auth off": (lambda s: s.pop("authOptions"), "authOptions"),
    "shared volume not mounted": (lambda s: _ray_container(_gpu_group(s)["template"]).__setitem__(
        "volumeMounts", [m for m in _ray_container(_gpu_group(s)["template"])["volumeMounts"]
                         if m["mountPath"] != SHARED]), f"not mounted at {SHARED}"),
    "rayStartParams not strings": (lambda s: s["headGroupSpec"]["rayStartParams"].__setitem__("num-cpus", 0),
                                   "mapping of strings"),
    "no headGroupSpec": (lambda s: s.pop("headGroupSpec"), "headGroupSpec is missing"),
    "wrong Ray version": (lambda s: s.__setitem__("rayVersion", "2.9.0"), "rayVersion"),
}


@pytest.mark.parametrize("name,path", [("raycluster.yaml", ("spec",)), ("rayjob.yaml", ("spec", "rayClusterSpec"))])
@pytest.mark.parametrize("breakage", sorted(KUBERAY_REJECTS))
def test_kuberay_checks_catch_a_broken_manifest(name, path, breakage):
    doc = load_docs(name)[0]
    spec = doc
    for key in path:
        spec = spec[key]
    mutate, expected = KUBERAY_REJECTS[breakage]
    mutate(spec)
    problems = raycluster_spec_problems(spec)
    assert any(expected in p for p in problems), problems


# --------------------------------------------------------------------------------------------- #
# KubeRay manifests against KubeRay's own CRDs
# --------------------------------------------------------------------------------------------- #

CRD_DIR = ROOT / "tests" / "fixtures" / "kuberay_crd"
#: the oldest KubeRay release the manifests are written for ("KubeRay v1.6 or newer" in their headers);
#: its CRD files are vendored unchanged under CRD_DIR, each after one line naming where it came from
KUBERAY_CRD_RELEASE = "v1.6.2"
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}


def strict_schema(node: Any) -> Any:
    """A CRD's OpenAPI v3 schema as a JSON Schema that the API server's checks would agree with.

    Unknown fields are errors (``kubectl apply`` validates fields strictly by default; the API server
    would otherwise drop them without a word) unless the schema preserves them; ``nullable`` admits
    null. The CRD's CEL rules (``x-kubernetes-validations``) are not evaluated.
    """
    if isinstance(node, list):
        return [strict_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: (v if k in ("enum", "default", "example") else strict_schema(v))
           for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if "properties" in out:
        # property names are data, not keywords: only their schemas are converted
        out["properties"] = {name: strict_schema(sub) for name, sub in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


_CRD_VALIDATORS: Dict[str, Any] = {}


def crd_validator(kind: str):
    """jsonschema validator of the ``v1`` openAPIV3Schema in the vendored CRD of ``kind``."""
    if kind not in _CRD_VALIDATORS:
        import jsonschema

        text = (CRD_DIR / CRD_FILES[kind]).read_text()
        source = text.splitlines()[0]
        assert source.startswith(f"# KubeRay {KUBERAY_CRD_RELEASE} CRD, vendored unchanged") and \
            "https://github.com/ray-project/kuberay/blob/" in source, source
        crd = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == kind
        v1 = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        assert v1["served"] and v1["storage"]
        schema = strict_schema(v1["schema"]["openAPIV3Schema"])
        jsonschema.Draft7Validator.check_schema(schema)
        _CRD_VALIDATORS[kind] = jsonschema.Draft7Validator(schema)
    return _CRD_VALIDATORS[kind]


def crd_problems(doc: Dict[str, Any]) -> List[str]:
    """Where ``doc`` breaks its kind's CRD schema, one line each (``spec.a.b: message``)."""
    errors = sorted(crd_validator(doc["kind"]).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


@pytest.mark.parametrize("name,kind", [("raycluster.yaml", "RayCluster"), ("rayjob.yaml", "RayJob")])
def test_kuberay_manifest_is_valid_against_kuberays_crd(name, kind):
    problems = crd_problems(the_doc(name, kind))
    assert not problems, f"{name} breaks KubeRay {KUBERAY_CRD_RELEASE}'s {kind} CRD:\n  " + "\n  ".join(problems)


def _rayjob_worker(doc):
    return doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]


CRD_REJECTS = {
    # a misspelt field: the API server's strict field validation refuses it (or drops it, unvalidated)
    "misspelt redisAddress": ("raycluster.yaml", lambda d: d["spec"]["gcsFaultToleranceOptions"].__setitem__(
        "redisAdress", d["spec"]["gcsFaultToleranceOptions"].pop("redisAddress")),
        "spec.gcsFaultToleranceOptions: Additional properties are not allowed ('redisAdress' was unexpected)"),
    "misspelt submitter backoffLimit": ("rayjob.yaml", lambda d: d["spec"]["submitterConfig"].__setitem__(
        "backOffLimit", 4), "spec.submitterConfig: Additional properties are not allowed ('backOffLimit'"),
    "backoffLimit a string": ("rayjob.yaml", lambda d: d["spec"].__setitem__("backoffLimit", "2"),
                              "spec.backoffLimit: '2' is not of type 'integer'"),
    "worker group without groupName": ("rayjob.yaml", lambda d: _rayjob_worker(d).pop("groupName"),
                                       "spec.rayClusterSpec.workerGroupSpecs.0: 'groupName' is a required property"),
    "container without name": ("raycluster.yaml",
                               lambda d: d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].pop("name"),
                               "spec.headGroupSpec.template.spec.containers.0: 'name' is a required property"),
    "GPU limit not a quantity": ("rayjob.yaml", lambda d: _ray_container(_rayjob_worker(d)["template"])["resources"][
        "limits"].__setitem__("nvidia.com/gpu", "four"), "limits.nvidia.com/gpu: 'four' does not match"),
    "redis password as a list": ("raycluster.yaml", lambda d: d["spec"]["gcsFaultToleranceOptions"].__setitem__(
        "redisPassword", ["secret"]), "spec.gcsFaultToleranceOptions.redisPassword: ['secret'] is not of type"),
}


@pytest.mark.parametrize("breakage", sorted(CRD_REJECTS))
def test_crd_check_catches_a_broken_field(breakage):
    name, mutate, expected = CRD_REJECTS[breakage]
    doc = copy.deepcopy(load_docs(name)[0])
    assert crd_problems(doc) == []
    mutate(doc)
    problems = crd_problems(doc)
    assert any(expected in p for p in problems), problems


# --------------------------------------------------------------------------------------------- #
# Head pod loss: GCS fault tolerance (RayCluster) and resubmission (RayJob)
# --------------------------------------------------------------------------------------------- #


def _secret_ref(env_or_value: Dict[str, Any]) -> Dict[str, Any]:
    return ((env_or_value or {}).get("valueFrom") or {}).get("secretKeyRef") or {}


def gcs_ft_problems(rc: Dict[str, Any], redis_docs: List[Dict[str, Any]]) -> List[str]:
    """The standing RayCluster keeps its GCS in the Redis of redis.yaml, as KubeRay v1.6 accepts it."""
    problems: List[str] = []
    spec = rc.get("spec") or {}
    ft = spec.get("gcsFaultToleranceOptions")
    if not isinstance(ft, dict):
        return ["spec.gcsFaultToleranceOptions is missing: a head pod restart would lose the cluster's state "
                "and restart every worker pod"]
    service = next((d for d in redis_docs if d.get("kind") == "Service"), {})
    deployment = next((d for d in redis_docs if d.get("kind") == "Deployment"), {})
    ports = {p.get("port") for p in (service.get("spec") or {}).get("ports") or []}
    host, _, port = str(ft.get("redisAddress", "")).rpartition(":")
    if host != (service.get("metadata") or {}).get("name") or not port.isdigit() or int(port) not in ports:
        problems.append(f"redisAddress {ft.get('redisAddress')!r} is not the Service of redis.yaml "
                        f"({(service.get('metadata') or {}).get('name')}:{sorted(ports)})")
    password = ft.get("redisPassword") or {}
    ref = _secret_ref(password)
    if "value" in password or not ref.get("name") or not ref.get("key"):
        problems.append(f"redisPassword must come from a Secret (valueFrom.secretKeyRef), not {password!r}")
    pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    redis_refs = [_secret_ref(e) for c in pod.get("containers") or [] for e in c.get("env") or []]
    if ref and {"name": ref.get("name"), "key": ref.get("key")} not in \
            [{"name": r.get("name"), "key": r.get("key")} for r in redis_refs]:
        problems.append(f"redisPassword's Secret {ref.get('name')}/{ref.get('key')} is not the one Redis reads "
                        f"({redis_refs})")
    # what KubeRay v1.6 refuses beside gcsFaultToleranceOptions (ray-operator/controllers/ray/utils/validation.go)
    head = spec.get("headGroupSpec") or {}
    if {"redis-password", "redis-username"} & set(head.get("rayStartParams") or {}):
        problems.append("redis-password/redis-username in the head's rayStartParams: use gcsFaultToleranceOptions")
    env = [e.get("name") for c in ((head.get("template") or {}).get("spec") or {}).get("containers") or []
           for e in c.get("env") or []]
    for name in ("REDIS_PASSWORD", "RAY_REDIS_ADDRESS", "REDIS_USERNAME"):
        if name in env:
            problems.append(f"{name} in the head's env: KubeRay refuses it with gcsFaultToleranceOptions")
    annotations = (rc.get("metadata") or {}).get("annotations") or {}
    for key in ("ray.io/ft-enabled", "ray.io/external-storage-namespace"):
        if key in annotations:
            problems.append(f"annotation {key}: KubeRay refuses it with gcsFaultToleranceOptions")
    return problems


def rayjob_resubmission_problems(job: Dict[str, Any]) -> List[str]:
    """A RayJob that runs its entrypoint again after a head pod loss, as the same rayemb job."""
    problems: List[str] = []
    spec = job.get("spec") or {}
    if spec.get("submissionMode", "K8sJobMode") != "K8sJobMode":
        problems.append(f"submissionMode {spec.get('submissionMode')!r}: the submitter Job's retries resubmit "
                        "to a restarted head only in K8sJobMode")
    if int((spec.get("submitterConfig") or {}).get("backoffLimit", 2)) < 1:
        problems.append("submitterConfig.backoffLimit < 1: a lost head ends the submitter for good")
    if not isinstance(spec.get("backoffLimit"), int) or spec["backoffLimit"] < 1:
        problems.append(f"backoffLimit {spec.get('backoffLimit')!r}: a failed job is never run again on a new cluster")
    if (spec.get("rayClusterSpec") or {}).get("gcsFaultToleranceOptions") is not None:
        problems.append("rayClusterSpec.gcsFaultToleranceOptions: a restarted head would keep the dead job's "
                        "submission id, so the submitter's retry would not resubmit it")
    if spec.get("jobId"):
        problems.append("jobId is fixed: a retry on a new cluster needs a fresh submission id")
    argv = shlex.split(spec.get("entrypoint") or "")
    names = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--set" and argv[i + 1].startswith("name=")]
    if len(names) != 1 or not re.fullmatch(r"name=[A-Za-z0-9][A-Za-z0-9._-]*", names[0]):
        problems.append(f"the entrypoint must fix the job's name with one literal `--set name=...` (its identity: "
                        f"a resubmission continues that job's run), not {names}")
    if "--new-run" in argv or "--resume-from" in argv:
        problems.append("--new-run / --resume-from in the entrypoint: every resubmission would start over")
    return problems


def test_raycluster_keeps_its_gcs_in_the_redis_of_redis_yaml():
    redis = load_docs("redis.yaml")
    assert {d["kind"] for d in redis} == {"Service", "Deployment", "PersistentVolumeClaim"}
    assert gcs_ft_problems(the_doc("raycluster.yaml", "RayCluster"), redis) == []
    assert not HEX_TOKEN.search((KUBERAY / "redis.yaml").read_text()), "redis.yaml: a password-like hex string"
    deployment = the_doc("redis.yaml", "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert the_doc("redis.yaml", "Service")["spec"]["selector"].items() <= labels.items()


def test_rayjob_runs_its_entrypoint_again_after_a_head_loss():
    assert rayjob_resubmission_problems(the_doc("rayjob.yaml", "RayJob")) == []


GCS_FT_REJECTS = {
    "no GCS fault tolerance": (lambda rc, r: rc["spec"].pop("gcsFaultToleranceOptions"),
                               "gcsFaultToleranceOptions is missing"),
    "another Redis host": (lambda rc, r: rc["spec"]["gcsFaultToleranceOptions"].__setitem__(
        "redisAddress", "redis:6379"), "is not the Service of redis.yaml"),
    "password in the manifest": (lambda rc, r: rc["spec"]["gcsFaultToleranceOptions"].__setitem__(
        "redisPassword", {"value": "hunter2"}), "must come from a Secret"),
    "Redis reads another Secret": (lambda rc, r: _secret_ref(next(d for d in r if d["kind"] == "Deployment")[
        "spec"]["template"]["spec"]["containers"][0]["env"][0]).__setitem__("name", "other"), "is not the one Redis"),
    "REDIS_PASSWORD in the head env": (lambda rc, r: _ray_container(rc["spec"]["headGroupSpec"]["template"])[
        "env"].append({"name": "REDIS_PASSWORD", "value": "x"}), "REDIS_PASSWORD in the head's env"),
    "ft-enabled annotation": (lambda rc, r: rc["metadata"].setdefault("annotations", {}).__setitem__(
        "ray.io/ft-enabled", "true"), "annotation ray.io/ft-enabled"),
}


@pytest.mark.parametrize("breakage", sorted(GCS_FT_REJECTS))
def test_gcs_ft_checks_catch_a_broken_manifest(breakage):
    rc, redis = copy.deepcopy(the_doc("raycluster.yaml", "RayCluster")), copy.deepcopy(load_docs("redis.yaml"))
    mutate, expected = GCS_FT_REJECTS[breakage]
    mutate(rc, redis)
    assert any(expected in p for p in gcs_ft_problems(rc, redis)), gcs_ft_problems(rc, redis)


def _set_entrypoint(job, old, new):
    assert old in job["spec"]["entrypoint"]
    job["spec"]["entrypoint"] = job["spec"]["entrypoint"].replace(old, new)


RESUBMISSION_REJECTS = {
    "no RayJob retries": (lambda j: j["spec"].pop("backoffLimit"), "backoffLimit None"),
    "no submitter retries": (lambda j: j["spec"]["submitterConfig"].__setitem__("backoffLimit", 0),
                             "submitterConfig.backoffLimit < 1"),
    "HTTP mode": (lambda j: j["spec"].__setitem__("submissionMode", "HTTPMode"), "only in K8sJobMode"),
    "GCS FT in the job's cluster": (lambda j: j["spec"]["rayClusterSpec"].__setitem__(
        "gcsFaultToleranceOptions", {"redisAddress": "rayemb-redis:6379"}), "keep the dead job's submission id"),
    "a fixed jobId": (lambda j: j["spec"].__setitem__("jobId", "rayemb-train-1"), "jobId is fixed"),
    "no job name": (lambda j: _set_entrypoint(j, "--set name=rayemb-train ", ""), "must fix the job's name"),
    "a per-submission name": (lambda j: _set_entrypoint(j, "name=rayemb-train", "name=rayemb-$(date +%s)"),
                              "must fix the job's name"),
    "a new run every time": (lambda j: _set_entrypoint(j, "--set name=rayemb-train", "--set name=rayemb-train --new-run"),
                             "every resubmission would start over"),
}


@pytest.mark.parametrize("breakage", sorted(RESUBMISSION_REJECTS))
def test_resubmission_checks_catch_a_broken_rayjob(breakage):
    job = copy.deepcopy(the_doc("rayjob.yaml", "RayJob"))
    mutate, expected = RESUBMISSION_REJECTS[breakage]
    mutate(job)
    assert any(expected in p for p in rayjob_resubmission_problems(job)), rayjob_resubmission_problems(job)


# --------------------------------------------------------------------------------------------- #
# Dockerfile
# --------------------------------------------------------------------------------------------- #

DOCKERFILE = CLUSTER / "Dockerfile"


def dockerfile_instructions(text: str) -> List[tuple]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def dockerfile_workdir(text: str) -> str:
    workdirs = [a for i, a in dockerfile_instructions(text) if i == "WORKDIR"]
    return workdirs[-1] if workdirs else "/"


def _torch_guard(text: str) -> str:
    """The requirement that keeps a CPU torch wheel (e.g. in pip's find-links) out of a GPU install."""
    m = re.search(r'"torch==\$torch_version,!=\$torch_version\+cpu"', text)
    return m.group(0) if m else ""


def dockerfile_problems(text: str) -> List[str]:
    """What in a Dockerfile would break the install from the lock or the `python jobs/train.py` entry."""
    problems: List[str] = []
    ins = dockerfile_instructions(text)
    kinds = [i for i, _ in ins]
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] if "=" in a else "" for i, a in ins if i == "ARG"}
    base = args.get("BASE_IMAGE", "")
    if not base.startswith(f"rayproject/ray:{locked_version('ray')}-py311"):
        problems.append(f"BASE_IMAGE {base!r} is not Ray {locked_version('ray')} on Python 3.11 (the lock's)")
    if not any(i == "FROM" and "${BASE_IMAGE}" in a for i, a in ins):
        problems.append("FROM does not use the BASE_IMAGE argument")
    for ref in sorted(set(re.findall(r"requirements/[\w.-]+\.txt", text))):
        if not (ROOT / ref).is_file():
            problems.append(f"{ref} does not exist in the repository")
    copied = " ".join(a for i, a in ins if i == "COPY")
    for lock in ("requirements/lock-cpu.txt", "requirements/lock-gpu.txt"):
        if lock not in copied:
            problems.append(f"the lock {lock} is not copied into the image")
    if 'lock="requirements/lock-$RAYEMB_EXTRA.txt"' not in text:
        problems.append("the lock is not picked by RAYEMB_EXTRA (lock-gpu.txt for gpu, lock-cpu.txt for cpu)")
    install_sh = (ROOT / "scripts" / "install.sh").read_text()
    if not _torch_guard(text) or _torch_guard(text) != _torch_guard(install_sh):
        problems.append("the GPU install does not refuse torch's +cpu build as scripts/install.sh does")
    if "install-no-deps" not in text or "--no-deps" not in text:
        problems.append("torchrec is not installed with --no-deps from [tool.rayemb] install-no-deps")
    if "ENTRYPOINT" in kinds:
        problems.append("ENTRYPOINT is set: the launcher runs `IMAGE bash` and KubeRay sets the command")
    workdir = dockerfile_workdir(text)
    if workdir == "/":
        problems.append("no WORKDIR: `python jobs/train.py` needs the repository as working directory")
    last_workdir = max((n for n, (i, _) in enumerate(ins) if i == "WORKDIR"), default=-1)
    copies_repo = any(i == "COPY" and a.split()[-2:] in (["."] * 2, [".", "./"], [".", workdir], [".", workdir + "/"])
                      for n, (i, a) in enumerate(ins) if n > last_workdir)
    if not copies_repo:
        problems.append("the repository is not copied into the WORKDIR (COPY . .) after it is set")
    return problems


def dockerignore_patterns() -> List[str]:
    path = ROOT / ".dockerignore"
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_dockerfile_installs_from_the_lock_and_reaches_train_py():
    text = DOCKERFILE.read_text()
    assert dockerfile_problems(text) == []
    assert (ROOT / "jobs" / "train.py").is_file()
    patterns = dockerignore_patterns()
    for kept in ("jobs/train.py", "jobs/configs/synth_small.yaml", "requirements/lock-cpu.txt",
                 "requirements/lock-gpu.txt", "pyproject.toml", "rayemb/config.py", "scripts/install.sh"):
        assert not any(fnmatch.fnmatch(kept, p) or kept.split("/")[0] == p.rstrip("/") for p in patterns), kept
    for left_out in (".venv", "data", "runs", "bench-results"):
        assert left_out in patterns


def test_launcher_head_setup_uses_the_lock_inside_the_image():
    # `~` is /home/ray in the rayproject images (the cluster launcher's container user)
    workdir = dockerfile_workdir(DOCKERFILE.read_text())
    for name in LAUNCHER_CONFIGS:
        for cmd in load_launcher(name)["head_setup_commands"]:
            for ref in re.findall(r"-c (\S+)", cmd):
                assert ref.replace("~/", "/home/ray/") == f"{workdir}/requirements/lock-cpu.txt", (name, ref)


DOCKERFILE_BREAKAGES = {
    "missing lock": (lambda t: t.replace("requirements/lock-gpu.txt", "requirements/lock-cuda.txt"), "does not exist"),
    "one lock for both": (lambda t: t.replace('lock="requirements/lock-$RAYEMB_EXTRA.txt"',
                                              'lock="requirements/lock-cpu.txt"'), "picked by RAYEMB_EXTRA"),
    "entrypoint": (lambda t: t + '\nENTRYPOINT ["python", "jobs/train.py"]\n', "ENTRYPOINT"),
    "no workdir": (lambda t: re.sub(r"^WORKDIR .*$", "", t, flags=re.M), "no WORKDIR"),
    "repo not copied": (lambda t: t.replace("COPY --chown=ray:users . .", ""), "not copied"),
    "CPU torch admitted": (lambda t: t.replace(",!=$torch_version+cpu", ""), "+cpu build"),
    "torchrec with deps": (lambda t: t.replace("$install --no-deps $nodeps", "$install $nodeps")
                           .replace("--no-deps", ""), "--no-deps"),
    "other Ray": (lambda t: t.replace("rayproject/ray:2.60.0-py311-gpu", "rayproject/ray:2.9.0-py311-gpu"),
                  "BASE_IMAGE"),
}


@pytest.mark.parametrize("breakage", sorted(DOCKERFILE_BREAKAGES))
def test_dockerfile_checks_catch_a_broken_dockerfile(breakage):
    mutate, expected = DOCKERFILE_BREAKAGES[breakage]
    broken = mutate(DOCKERFILE.read_text())
    assert broken != DOCKERFILE.read_text()
    problems = dockerfile_problems(broken)
    assert any(expected in p for p in problems), problems


def test_install_no_deps_is_what_the_dockerfile_reads():
    # the Dockerfile reads [tool.rayemb] install-no-deps the way scripts/install.sh does
    d = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert d["tool"]["rayemb"]["install-no-deps"]
    assert '["tool"]["rayemb"]["install-no-deps"]' in DOCKERFILE.read_text()


# --------------------------------------------------------------------------------------------- #
# NVIDIA driver: every GPU node must run the CUDA of the GPU lock's torch
# --------------------------------------------------------------------------------------------- #

#: the oldest NVIDIA driver branch that runs each CUDA major (CUDA's minor-version compatibility:
#: any 12.x on R525+, any 13.x on R580+)
MIN_DRIVER_FOR_CUDA = {12: 525, 13: 580}
#: the CUDA toolkit of rayproject/ray's GPU tags: `-cuXYZ` says it, `-gpu` is an alias of the cu121 image
RAY_GPU_TAG_CUDA = {"gpu": (12, 1)}
#: a node's start-up driver check, as the configs write it
DRIVER_CHECK = re.compile(r'nvidia-smi --query-gpu=driver_version.*?"\$\{driver%%\.\*\}" -ge (\d+)', re.S)


def lock_pins(path: Path) -> Dict[str, str]:
    return {m.group(1).lower().replace("_", "-"): m.group(2)
            for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$", path.read_text(), re.M)}


def lock_cuda(pins: Dict[str, str]) -> tuple:
    """(major, minor) of the CUDA the lock's torch is built for: its cuda-toolkit, which the nvidia-*-cuNN
    packages must agree with; an AssertionError for a lock without one (a CPU lock)."""
    assert "+" not in pins.get("torch", "+"), f"the lock's torch is not a CUDA build: {pins.get('torch')}"
    assert "cuda-toolkit" in pins, "the lock pins no cuda-toolkit (torch's CUDA runtime)"
    major, minor = (int(x) for x in pins["cuda-toolkit"].split(".")[:2])
    suffixes = {int(m.group(1)) for name in pins for m in [re.search(r"^nvidia-.*-cu(\d+)$", name)] if m}
    assert suffixes <= {major}, f"nvidia-*-cu{sorted(suffixes)} packages disagree with cuda-toolkit {major}.{minor}"
    return major, minor


def min_driver_for(cuda: tuple) -> int:
    assert cuda[0] in MIN_DRIVER_FOR_CUDA, f"no minimum NVIDIA driver known for CUDA {cuda[0]}.x"
    return MIN_DRIVER_FOR_CUDA[cuda[0]]


def driver_problems(config: Dict[str, Any], cuda: tuple) -> List[str]:
    """Where a launcher config's GPU nodes could run an NVIDIA driver older than ``cuda`` needs."""
    problems: List[str] = []
    need = min_driver_for(cuda)
    init = " ".join(config.get("initialization_commands") or [])
    checks = [int(v) for v in DRIVER_CHECK.findall(init)]
    if not checks or "lspci" not in init:
        problems.append("initialization_commands do not check the NVIDIA driver version on GPU nodes")
    for v in checks:
        if v < need:
            problems.append(f"the start-up driver check admits {v}, older than the {need} CUDA {cuda[0]}.{cuda[1]} needs")
    for name, t in (config.get("available_node_types") or {}).items():
        for disk in (t.get("node_config") or {}).get("disks") or []:
            image = (disk.get("initializeParams") or {}).get("sourceImage", "")
            m = re.search(r"-nvidia-(\d+)$", image)
            if not m:
                problems.append(f"node type {name}: image {image!r} names no NVIDIA driver branch (-nvidia-NNN)")
            elif int(m.group(1)) < need:
                problems.append(f"node type {name}: image {image!r} has driver {m.group(1)}, "
                                f"older than the {need} CUDA {cuda[0]}.{cuda[1]} needs")
    return problems


def test_the_gpu_lock_is_torchs_cuda_13_build_and_the_cpu_lock_is_not():
    pins = lock_pins(GPU_LOCK)
    assert lock_cuda(pins) == (13, 0)
    assert pins["torch"] == locked_version("torch").split("+")[0]  # the same release as the CPU lock's
    with pytest.raises(AssertionError, match="not a CUDA build"):
        lock_cuda(lock_pins(LOCK))
    # the lock generator states the CUDA in the header, for people
    assert "is the CUDA 13.0 build" in GPU_LOCK.read_text()


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_launcher_gpu_nodes_run_the_gpu_locks_cuda(name):
    cuda = lock_cuda(lock_pins(GPU_LOCK))
    assert driver_problems(load_launcher(name), cuda) == []


def _old_family(c: Dict[str, Any]) -> None:
    for disk in _gpu_type(c)["node_config"]["disks"]:
        disk["initializeParams"]["sourceImage"] = disk["initializeParams"]["sourceImage"].replace("-nvidia-580",
                                                                                                  "-nvidia-570")


DRIVER_BREAKAGES = {
    "no driver check": (LAUNCHER_CONFIGS, lambda c: c.__setitem__(
        "initialization_commands", [x for x in c["initialization_commands"] if "nvidia-smi" not in x]),
        "do not check the NVIDIA driver"),
    "check admits 570": (LAUNCHER_CONFIGS, lambda c: c.__setitem__(
        "initialization_commands", [x.replace("-ge 580", "-ge 570") for x in c["initialization_commands"]]),
        "admits 570"),
    "driver-570 image family": (["gcp.yaml"], _old_family, "has driver 570"),
}


@pytest.mark.parametrize("breakage", sorted(DRIVER_BREAKAGES))
def test_driver_checks_catch_a_config_that_cannot_run_cuda_13(breakage):
    names, mutate, expected = DRIVER_BREAKAGES[breakage]
    cuda = lock_cuda(lock_pins(GPU_LOCK))
    for name in names:
        config = load_launcher(name)
        mutate(config)
        problems = driver_problems(config, cuda)
        assert any(expected in p for p in problems), (name, problems)


def test_a_cuda_12_lock_needs_only_r525_and_an_unknown_cuda_is_an_error():
    config = load_launcher("gcp.yaml")
    _old_family(config)
    config["initialization_commands"] = [x.replace("-ge 580", "-ge 570") for x in config["initialization_commands"]]
    assert driver_problems(config, (12, 8)) == []  # a driver-570 image ran the CUDA 12.8 torch
    assert driver_problems(config, (13, 0)) != []
    with pytest.raises(AssertionError, match="CUDA 14.x"):
        driver_problems(config, (14, 0))


def test_the_start_up_driver_check_refuses_old_drivers(tmp_path):
    """The launcher configs' and KubeRay's check, run with a stand-in nvidia-smi printing each driver version."""
    import subprocess

    kuberay = _gpu_group(the_doc("raycluster.yaml", "RayCluster")["spec"])["template"]["spec"]["initContainers"][0]
    scripts = {"kuberay": kuberay["command"][2]}
    for name in LAUNCHER_CONFIGS:
        scripts[name] = next(c for c in load_launcher(name)["initialization_commands"] if "nvidia-smi" in c)
    fake = tmp_path / "bin"
    fake.mkdir()
    for driver, ok in (("570.172.08", False), ("580.95.05", True), ("595.71.05", True), ("", False)):
        # a plain `nvidia-smi` (the wait for the driver) succeeds; the version query prints `driver`
        (fake / "nvidia-smi").write_text(f"#!/bin/sh\n[ $# -eq 0 ] && exit 0\n[ -n '{driver}' ] && echo '{driver}' || exit 9\n")
        (fake / "nvidia-smi").chmod(0o755)
        # the launcher checks run on GPU hosts only: a stand-in lspci says this is one
        (fake / "lspci").write_text("#!/bin/sh\necho '00:1e.0 3D controller: NVIDIA Corporation GA102GL [A10G]'\n")
        (fake / "lspci").chmod(0o755)
        for where, script in scripts.items():
            p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                               env={"PATH": f"{fake}:/usr/bin:/bin"})
            assert (p.returncode == 0) == ok, (where, driver, p.returncode, p.stderr)
            if not ok:
                assert "older than 580" in p.stderr, (where, p.stderr)


def kuberay_driver_problems(spec: Dict[str, Any], cuda: tuple) -> List[str]:
    problems: List[str] = []
    need = min_driver_for(cuda)
    for g in spec["workerGroupSpecs"]:
        if not _gpu_limit(g):
            continue
        inits = (g["template"]["spec"].get("initContainers") or [])
        checks = [(c, [int(v) for v in DRIVER_CHECK.findall(" ".join(c.get("command") or []))]) for c in inits]
        checks = [(c, v) for c, v in checks if v]
        if not checks:
            problems.append(f"GPU group {g['groupName']}: no init container checks the NVIDIA driver")
        for c, versions in checks:
            if min(versions) < need:
                problems.append(f"GPU group {g['groupName']}: the driver check admits {min(versions)} (< {need})")
            gpus = ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
            if str(gpus) != str(_gpu_limit(g)):
                problems.append(f"GPU group {g['groupName']}: the driver check asks for {gpus} GPUs, not the "
                                f"Ray container's {_gpu_limit(g)} (without GPUs it sees no driver)")
            if c.get("image") != _ray_container(g["template"]).get("image"):
                problems.append(f"GPU group {g['groupName']}: the driver check runs another image")
    return problems


@pytest.mark.parametrize("name,path", [("raycluster.yaml", ("spec",)), ("rayjob.yaml", ("spec", "rayClusterSpec"))])
def test_kuberay_gpu_pods_check_the_driver(name, path):
    spec = load_docs(name)[0]
    for key in path:
        spec = spec[key]
    cuda = lock_cuda(lock_pins(GPU_LOCK))
    assert kuberay_driver_problems(spec, cuda) == []
    broken = copy.deepcopy(spec)
    init = _gpu_group(broken)["template"]["spec"]["initContainers"][0]
    init["command"][2] = init["command"][2].replace("-ge 580", "-ge 550")
    init["resources"]["limits"].pop("nvidia.com/gpu")
    problems = kuberay_driver_problems(broken, cuda)
    assert any("admits 550" in p for p in problems) and any("asks for None GPUs" in p for p in problems), problems
    _gpu_group(broken)["template"]["spec"].pop("initContainers")
    assert any("no init container" in p for p in kuberay_driver_problems(broken, cuda))


def test_the_images_base_cuda_needs_no_newer_driver_than_the_lock():
    """torch brings its own CUDA runtime; the base image's toolkit must not ask the host for more than it."""
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for i, a in dockerfile_instructions(DOCKERFILE.read_text())
            if i == "ARG" and "=" in a}
    tag = args["BASE_IMAGE"].rsplit("-", 1)[1]
    m = re.fullmatch(r"cu(\d\d)(\d)", tag)
    base = (int(m.group(1)), int(m.group(2))) if m else RAY_GPU_TAG_CUDA[tag]
    assert min_driver_for(base) <= min_driver_for(lock_cuda(lock_pins(GPU_LOCK)))


# --------------------------------------------------------------------------------------------- #
# The GPU model of the GPU node types: what a job planned before any GPU node is up reads
# --------------------------------------------------------------------------------------------- #

#: GPU model (Ray's accelerator_type name) of a GCP accelerator type / an AWS instance family
GCP_ACCELERATOR_MODEL = {"nvidia-tesla-a100": "A100", "nvidia-a100-80gb": "A100-80G", "nvidia-l4": "L4",
                         "nvidia-h100-80gb": "H100", "nvidia-h200-141gb": "H200", "nvidia-tesla-t4": "T4"}
AWS_FAMILY_MODEL = {"g5": "A10G", "g6": "L4", "p4d": "A100", "p4de": "A100-80G", "p5": "H100", "p5e": "H200",
                    "g4dn": "T4"}


def gpu_model_problems(config: Dict[str, Any]) -> List[str]:
    from rayemb.planner.topology import KNOWN_GPU_HBM_BYTES

    problems: List[str] = []
    name = next(n for n, t in config["available_node_types"].items() if t is _gpu_type(config))
    t = _gpu_type(config)
    named = [k.split(":", 1)[1] for k in t["resources"] if k.startswith("accelerator_type:")]
    if len(named) != 1:
        return [f"GPU node type {name}: resources name {len(named)} GPU models (accelerator_type:<model>), not one"]
    if named[0] not in KNOWN_GPU_HBM_BYTES:
        problems.append(f"GPU node type {name}: accelerator_type:{named[0]} has no known memory")
    node = t["node_config"]
    if config["provider"]["type"] == "gcp":
        actual = {GCP_ACCELERATOR_MODEL.get(a["acceleratorType"]) for a in node.get("guestAccelerators") or []}
    else:
        actual = {AWS_FAMILY_MODEL.get(node["InstanceType"].split(".")[0])}
    if actual != {named[0]}:
        problems.append(f"GPU node type {name}: accelerator_type:{named[0]} but the machine has {sorted(map(str, actual))}")
    return problems


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_launcher_gpu_type_names_its_gpu_model(name):
    config = load_launcher(name)
    assert gpu_model_problems(config) == []
    wrong = copy.deepcopy(config)
    res = _gpu_type(wrong)["resources"]
    model = next(k for k in res if k.startswith("accelerator_type:"))
    res["accelerator_type:H100"] = res.pop(model)
    assert any("but the machine has" in p for p in gpu_model_problems(wrong))
    res.pop("accelerator_type:H100")
    assert any("name 0 GPU models" in p for p in gpu_model_problems(wrong))


# --------------------------------------------------------------------------------------------- #
# AWS: the instance roles' S3 access (cluster/aws-s3-policy.json)
# --------------------------------------------------------------------------------------------- #

S3_POLICY = CLUSTER / "aws-s3-policy.json"
BUCKET = "REPLACE_ME_BUCKET"
#: S3 requests rayemb makes, as (IAM action, ARN, allowed?): reading a dataset, stats and checkpoints
#: anywhere in the bucket, and writing a job's outputs under tracking.output_dir = s3://BUCKET/runs
S3_REQUESTS = [
    ("s3:ListBucket", f"arn:aws:s3:::{BUCKET}", True),  # listing parquet parts, checkpoints; HEAD bucket
    ("s3:GetBucketLocation", f"arn:aws:s3:::{BUCKET}", True),  # pyarrow's region lookup
    ("s3:GetObject", f"arn:aws:s3:::{BUCKET}/criteo/train/part-00000.parquet", True),
    ("s3:GetObject", f"arn:aws:s3:::{BUCKET}/criteo/schema.yaml", True),
    ("s3:GetObject", f"arn:aws:s3:::{BUCKET}/runs/ray_results/job/checkpoint_0/meta.json", True),
    ("s3:PutObject", f"arn:aws:s3:::{BUCKET}/runs/ray_results/job/checkpoint_0/__0_0.distcp", True),
    ("s3:PutObject", f"arn:aws:s3:::{BUCKET}/runs/jobs/job/plan.json", True),
    ("s3:DeleteObject", f"arn:aws:s3:::{BUCKET}/runs/ray_results/job/checkpoint_0/meta.json", True),  # keep_checkpoints
    ("s3:AbortMultipartUpload", f"arn:aws:s3:::{BUCKET}/runs/ray_results/job/checkpoint_1/__3_0.distcp", True),
    # the data is read-only to the cluster, and other buckets are out of reach
    ("s3:PutObject", f"arn:aws:s3:::{BUCKET}/criteo/train/part-00000.parquet", False),
    ("s3:DeleteObject", f"arn:aws:s3:::{BUCKET}/criteo/schema.yaml", False),
    ("s3:GetObject", "arn:aws:s3:::someone-elses-bucket/secret.csv", False),
    ("s3:ListBucket", "arn:aws:s3:::someone-elses-bucket", False),
]


def s3_allows(policy: Dict[str, Any], action: str, arn: str) -> bool:
    """IAM's evaluation for one identity policy: an explicit Deny wins, else any Allow (wildcards as IAM's)."""
    def matches(statement: Dict[str, Any]) -> bool:
        actions = statement.get("Action", [])
        resources = statement.get("Resource", [])
        actions = [actions] if isinstance(actions, str) else actions
        resources = [resources] if isinstance(resources, str) else resources
        return (any(fnmatch.fnmatchcase(action.lower(), a.lower()) for a in actions)
                and any(fnmatch.fnmatchcase(arn, r) for r in resources))

    statements = policy.get("Statement", [])
    if any(s.get("Effect") == "Deny" and matches(s) for s in statements):
        return False
    return any(s.get("Effect") == "Allow" and matches(s) for s in statements)


def s3_policy_problems(policy: Dict[str, Any]) -> List[str]:
    problems: List[str] = []
    if policy.get("Version") != "2012-10-17":
        problems.append(f"Version {policy.get('Version')!r} is not 2012-10-17 (variables and wildcards need it)")
    for action, arn, allowed in S3_REQUESTS:
        if s3_allows(policy, action, arn) != allowed:
            problems.append(f"{action} on {arn} is {'denied' if allowed else 'allowed'}")
    for s in policy.get("Statement", []):
        resources = s.get("Resource", [])
        for r in [resources] if isinstance(resources, str) else resources:
            if not r.startswith(f"arn:aws:s3:::{BUCKET}"):
                problems.append(f"statement {s.get('Sid')}: resource {r!r} is not the bucket placeholder {BUCKET}")
    return problems


def test_aws_s3_policy_grants_reading_the_bucket_and_writing_outputs_under_runs():
    policy = json.loads(S3_POLICY.read_text())
    assert s3_policy_problems(policy) == []
    # the placeholder is documented with the others, and the deploy guide gives the policy to both roles
    assert BUCKET in (CLUSTER / "aws.yaml").read_text() and "aws-s3-policy.json" in (CLUSTER / "aws.yaml").read_text()
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert BUCKET in deploy and "cluster/aws-s3-policy.json" in deploy
    assert re.search(r"for r in rayemb-head rayemb-worker; do.*?put-role-policy.*?aws-s3-policy", deploy, re.S)


S3_POLICY_BREAKAGES = {
    "no list": (lambda p: p["Statement"].pop(0), "s3:ListBucket on arn:aws:s3:::REPLACE_ME_BUCKET is denied"),
    "writes the data": (lambda p: p["Statement"][2].__setitem__("Resource", f"arn:aws:s3:::{BUCKET}/*"),
                        "s3:PutObject on arn:aws:s3:::REPLACE_ME_BUCKET/criteo/train/part-00000.parquet is allowed"),
    "every bucket": (lambda p: p["Statement"][1].__setitem__("Resource", "*"), "someone-elses-bucket/secret.csv is allowed"),
    "no checkpoint cleanup": (lambda p: p["Statement"][2]["Action"].remove("s3:DeleteObject"), "s3:DeleteObject"),
    "denied reads": (lambda p: p["Statement"].append({"Effect": "Deny", "Action": "s3:*", "Resource": "*"}),
                     "s3:GetObject on arn:aws:s3:::REPLACE_ME_BUCKET/criteo/schema.yaml is denied"),
}


@pytest.mark.parametrize("breakage", sorted(S3_POLICY_BREAKAGES))
def test_s3_policy_checks_catch_a_broken_policy(breakage):
    policy = json.loads(S3_POLICY.read_text())
    mutate, expected = S3_POLICY_BREAKAGES[breakage]
    mutate(policy)
    problems = s3_policy_problems(policy)
    assert any(expected in p for p in problems), problems
