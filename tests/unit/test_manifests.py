"""deploy/kuberay/ holds KubeRay manifests that the operator would take and that say what
configs/serve.yaml, cluster.yaml and jobs/rebuild_knn.py say.

The checks that need Ray's own code (Serve's deploy schema, the job's argument parser, which
imports ``ray``) run in one child process: unit tests block ``import ray`` in this one."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml

from kuberay_schema import RAYJOB, RAYSERVICE

ROOT = Path(__file__).resolve().parents[2]
KUBERAY = ROOT / "deploy" / "kuberay"
CHECKOUT = "/home/ray/solaris"  # where the images hold this repository (rayservice.yaml)
TOKEN_SECRET = "solaris-tokens"
TOKEN_ENV = {"SOLARIS_SERVICE_TOKEN_FILE": "service_token",
             "SOLARIS_OPERATOR_TOKEN_FILE": "operator_token"}


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def service() -> dict:
    return load(KUBERAY / "rayservice.yaml")


@pytest.fixture(scope="module")
def job() -> dict:
    return load(KUBERAY / "rayjob-rebuild-knn.yaml")


@pytest.fixture(scope="module")
def cluster_yaml() -> dict:
    return load(ROOT / "cluster.yaml")


def entrypoint(job: dict) -> list[str]:
    return shlex.split(job["spec"]["entrypoint"])


def groups(cluster_spec: dict) -> dict[str, dict]:
    """``head`` and each worker group by name."""
    return {"head": cluster_spec["headGroupSpec"],
            **{g["groupName"]: g for g in cluster_spec.get("workerGroupSpecs", [])}}


def ray_container(group: dict) -> dict:
    return group["template"]["spec"]["containers"][0]  # KubeRay's Ray container is the first


def custom_resources(group: dict) -> dict:
    """``rayStartParams.resources`` read as KubeRay's autoscaler reads it: a JSON object
    inside an extra pair of quotes, its inner quotes escaped."""
    raw = group.get("rayStartParams", {}).get("resources")
    return {} if raw is None else json.loads(raw[1:-1].replace("\\", ""))


# ---- the child process with Ray's code ----------------------------------------------------------
_RAY_SIDE = r"""
import json, sys
from ray.serve.schema import ServeDeploySchema
from jobs.rebuild_knn import build_parser

def refuse(message):
    raise ValueError(message)

asked, out = json.load(sys.stdin), {"serve": [], "argv": []}
for conf in asked["serve"]:
    try:
        ServeDeploySchema.model_validate(conf)
        out["serve"].append(None)
    except Exception as e:
        out["serve"].append(str(e))
for argv in asked["argv"]:
    parser = build_parser()
    parser.error = refuse  # a refused command line raises instead of exiting
    try:
        out["argv"].append({"args": vars(parser.parse_args(argv))})
    except ValueError as e:
        out["argv"].append({"error": str(e)})
print(json.dumps(out, default=str))
"""

BROKEN_SERVE_DEPLOYMENT = {"max_ongoing_requests": "many"}
BROKEN_FLAGS = [["--output", "/a"], ["--encoders", "two"]]  # unknown flag, bad value


@pytest.fixture(scope="module")
def ray_side(service, job) -> dict:
    """Ray Serve's deploy schema on [configs/serve.yaml, the RayService's serveConfigV2, a
    broken copy] and the job's own parser on [the RayJob's flags, each of BROKEN_FLAGS]."""
    if importlib.util.find_spec("ray") is None:  # locates the package without importing it
        pytest.skip("ray is not installed: no Serve schema or job parser to check against")
    serve = load(ROOT / "configs" / "serve.yaml")
    broken = copy.deepcopy(serve)
    broken["applications"][0]["deployments"][0].update(BROKEN_SERVE_DEPLOYMENT)
    embedded = yaml.safe_load(service["spec"]["serveConfigV2"])
    flags = [entrypoint(job)[2:], *(["--data", "d", "--artifacts", "a", *f] for f in BROKEN_FLAGS)]
    asked = {"serve": [serve, embedded, broken], "argv": flags}
    run = subprocess.run([sys.executable, "-c", _RAY_SIDE], cwd=ROOT, input=json.dumps(asked),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


# ---- against KubeRay's CRDs ---------------------------------------------------------------------
def test_manifests_have_only_crd_fields_of_the_crd_types(service, job):
    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    RAYSERVICE.validate(service)
    RAYJOB.validate(job)


def test_the_crd_check_refuses_a_misspelled_field(service):
    broken = copy.deepcopy(service)
    head = broken["spec"]["rayClusterConfig"]["headGroupSpec"]
    head["rayStartParam"] = head.pop("rayStartParams")
    where = r"spec\.rayClusterConfig\.headGroupSpec\.rayStartParam"
    with pytest.raises(ValueError, match=where + ": unknown field"):
        RAYSERVICE.validate(broken)


def test_the_crd_check_refuses_a_wrong_type_and_a_missing_required_field(job):
    broken = copy.deepcopy(job)
    workers = broken["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    workers[0]["rayStartParams"]["num-cpus"] = 4  # rayStartParams take strings only
    del workers[1]["groupName"]
    broken["spec"]["shutdownAfterJobFinishes"] = "true"
    assert RAYJOB.problems(broken) == [
        "spec.shutdownAfterJobFinishes: expected boolean, got str 'true'",
        "spec.rayClusterSpec.workerGroupSpecs[0].rayStartParams.num-cpus: "
        "expected string, got int 4",
        "spec.rayClusterSpec.workerGroupSpecs[1].groupName: required field missing",
    ]


# ---- the RayService ----------------------------------------------------------------------------
def test_serve_config_v2_is_configs_serve_yaml(service):
    """Embedded because KubeRay takes the Serve config inline; equal, so they cannot drift."""
    embedded = yaml.safe_load(service["spec"]["serveConfigV2"])
    assert embedded == load(ROOT / "configs" / "serve.yaml")
    (app,) = embedded["applications"]
    assert app["import_path"] == "serve_app:build_app" and app["args"]["profile"] == "cluster"


def test_serve_configs_pass_serves_deploy_schema(ray_side):
    serve_yaml, embedded, broken = ray_side["serve"]
    assert serve_yaml is None and embedded is None  # no validation error
    assert broken is not None and "max_ongoing_requests" in broken


def test_service_cluster_is_cluster_yamls(service, cluster_yaml):
    """Head, CPU workers, GPU workers with `fm_gpu`: the node types, worker counts, Ray image
    and idle timeout of cluster.yaml, autoscaled by KubeRay's in-tree autoscaler."""
    spec = service["spec"]["rayClusterConfig"]
    assert spec["enableInTreeAutoscaling"] is True
    idle_s = cluster_yaml["idle_timeout_minutes"] * 60
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] == idle_s
    by_name = groups(spec)
    gpu = [g for n, g in by_name.items() if n != "head" and gpu_limit(g)]
    cpu = [g for n, g in by_name.items() if n != "head" and not gpu_limit(g)]
    assert len(gpu) == 1 and len(cpu) == 1 and len(by_name) == 3
    types = cluster_yaml["available_node_types"]
    for group, name in ((cpu[0], "cpu_worker"), (gpu[0], "gpu_worker")):
        assert (group["minReplicas"], group["maxReplicas"]) == (
            types[name]["min_workers"], types[name]["max_workers"]), name
    assert gpu_limit(gpu[0]) == types["gpu_worker"]["resources"]["GPU"] == 1
    assert custom_resources(gpu[0]) == {"fm_gpu": types["gpu_worker"]["resources"]["fm_gpu"]}
    assert custom_resources(cpu[0]) == {} and custom_resources(by_name["head"]) == {}
    assert by_name["head"]["rayStartParams"]["num-cpus"] == str(types["head"]["resources"]["CPU"])
    check_images(spec, cluster_yaml)


def gpu_limit(group: dict) -> int:
    limits = ray_container(group).get("resources", {}).get("limits", {})
    return int(limits.get("nvidia.com/gpu", 0))


def check_images(spec: dict, cluster_yaml: dict) -> None:
    """Every group runs the tag of cluster.yaml's Ray image (-gpu where there is a GPU), and
    rayVersion (KubeRay checks token auth against it) is that tag's Ray version."""
    gpu_node = cluster_yaml["available_node_types"]["gpu_worker"]
    cpu_tag = cluster_yaml["docker"]["image"].rsplit(":", 1)[1]
    gpu_tag = gpu_node["docker"]["worker_image"].rsplit(":", 1)[1]
    assert spec["rayVersion"] == cpu_tag.split("-")[0] == gpu_tag.split("-")[0]
    for name, group in groups(spec).items():
        tag = ray_container(group)["image"].rsplit(":", 1)[1]
        assert tag == (gpu_tag if gpu_limit(group) else cpu_tag), name


@pytest.mark.parametrize("manifest", ["service", "job"])
def test_every_ray_container_runs_in_the_checkout_with_token_auth(manifest, service, job):
    """The Serve config's and the entrypoint's relative paths resolve in the checkout; Ray's
    token authentication is on (KubeRay sets RAY_AUTH_MODE=token and RAY_AUTH_TOKEN)."""
    spec = (service["spec"]["rayClusterConfig"] if manifest == "service"
            else job["spec"]["rayClusterSpec"])
    assert spec["authOptions"]["mode"] == "token"
    for name, group in groups(spec).items():
        assert ray_container(group)["workingDir"] == CHECKOUT, name


def test_every_service_container_reads_the_apps_tokens_from_the_secret(service):
    """The names of cluster.yaml (SOLARIS_*_TOKEN_FILE), each naming a file of the Secret's
    matching key; Ray's own token comes from the same Secret (authOptions.secretName)."""
    spec = service["spec"]["rayClusterConfig"]
    assert spec["authOptions"]["secretName"] == TOKEN_SECRET
    for name, group in groups(spec).items():
        container = ray_container(group)
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        for var, key in TOKEN_ENV.items():
            assert secret_key_at(group, env[var]) == (TOKEN_SECRET, key), (name, var)
    how_to = f"kubectl create secret generic {TOKEN_SECRET}"  # the comment names the Secret
    assert how_to in (KUBERAY / "rayservice.yaml").read_text()


def secret_key_at(group: dict, path: str) -> tuple[str, str] | None:
    """(Secret, key) whose file ``path`` is in the group's Ray container, or None."""
    pod = group["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in ray_container(group).get("volumeMounts", []):
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret is None or not PurePosixPath(path).is_relative_to(mount["mountPath"]):
            continue
        rel = str(PurePosixPath(path).relative_to(mount["mountPath"]))
        for item in secret.get("items", []):
            if item["path"] == rel:
                return secret["secretName"], item["key"]
    return None


# ---- the RayJob --------------------------------------------------------------------------------
def test_job_runs_rebuild_knn_once_on_a_cluster_it_deletes(job, cluster_yaml):
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] >= 0
    assert "rayClusterSpec" in spec and "clusterSelector" not in spec
    argv = entrypoint(job)
    assert argv[:2] == ["python", "jobs/rebuild_knn.py"]
    assert (ROOT / argv[1]).is_file()  # relative to the checkout, the containers' workingDir
    if "--config" in argv:
        assert (ROOT / argv[argv.index("--config") + 1]).is_file()
    check_images(spec["rayClusterSpec"], cluster_yaml)


def test_job_flags_are_the_ones_rebuild_knn_takes(job, ray_side):
    parsed, *broken = ray_side["argv"]
    assert "error" not in parsed, parsed
    args = parsed["args"]
    assert args["every"] is None  # one rebuild: the cluster goes when the job ends
    assert args["out"]  # the tables' URI, not left to a config default
    by_name = groups(job["spec"]["rayClusterSpec"])
    if args["gpu"] == "yes":  # encoder tasks that ask for a GPU need GPU workers to run on
        assert any(gpu_limit(g) for g in by_name.values())
    # the driver (on the head) reads the artifacts: they are on a volume mounted there
    mounts = [m["mountPath"] for m in ray_container(by_name["head"]).get("volumeMounts", [])]
    assert any(PurePosixPath(args["artifacts"]).is_relative_to(m) for m in mounts)
    for flags, result in zip(BROKEN_FLAGS, broken):
        assert "error" in result and flags[0] in result["error"], (flags, result)


def test_every_service_container_names_cluster_yamls_state_root(service, cluster_yaml):
    """The cluster profile keeps its durable state under SOLARIS_STATE_URI (solaris/state.py)
    and refuses to start without it: every Ray container has cluster.yaml's root."""
    start = next(c for c in cluster_yaml["head_start_ray_commands"] if "ray start" in c)
    root = re.search(r"SOLARIS_STATE_URI=(\S+?);", start).group(1)
    for name, group in groups(service["spec"]["rayClusterConfig"]).items():
        env = {e["name"]: e["value"] for e in ray_container(group).get("env", [])}
        assert env.get("SOLARIS_STATE_URI") == root, name
