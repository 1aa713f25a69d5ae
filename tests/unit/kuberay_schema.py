"""The fields of KubeRay's RayService and RayJob that deploy/kuberay/ uses, and a checker.

Hand-written from the CRDs of KubeRay v1.7.0 (ray-project/kuberay tag v1.7.0, commit
59d663aeec13760646da3db9c1cf8cfe883e30b7: ray-operator/config/crd/bases/ray.io_rayservices.yaml
and ray.io_rayjobs.yaml, version v1). Only the fields the manifests use are described, with
the CRD's type and required keys (plus apiVersion, kind, metadata and spec, which every object
has), so a field the manifests start using must be added here (from the CRD) before the test
passes; the walker refuses any other key (a misspelling that
the API server would prune or refuse) and any value of another type (``num-cpus: 4`` where
``rayStartParams`` takes strings). ``metadata`` is Kubernetes' ObjectMeta, which the CRD
leaves to the API server; its few fields here are ObjectMeta's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# A Kubernetes resource quantity (x-kubernetes-int-or-string, the CRD's pattern).
_QUANTITY = re.compile(r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                       r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")


def _is(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "quantity":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, str) and _QUANTITY.match(value) is not None)
    raise ValueError(f"kuberay_schema: unknown kind {kind!r}")


@dataclass(frozen=True)
class Schema:
    """``fields``: path -> kind (object, array, string, integer, boolean, quantity); a path
    is dotted keys, ``[]`` for the items of an array, ``*`` for every value of a map.
    ``required``: path of an object -> the keys it must have."""

    fields: dict[str, str]
    required: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def problems(self, doc: Any) -> list[str]:
        """Every unknown field, wrong type and missing required key of ``doc``, each naming
        its path (``spec.rayClusterConfig.workerGroupSpecs[1].rayStartParams.num-cpus``)."""
        out: list[str] = []
        self._walk(doc, "", "", out)
        return out

    def validate(self, doc: Any) -> None:
        """ValueError listing ``problems(doc)``, if any."""
        found = self.problems(doc)
        if found:
            raise ValueError("; ".join(found))

    def _walk(self, value: Any, path: str, pattern: str, out: list[str]) -> None:
        kind = self.fields.get(pattern)
        if kind is None:
            out.append(f"{path}: unknown field")
            return
        if not _is(value, kind):
            out.append(f"{path or '<root>'}: expected {kind}, got {type(value).__name__} {value!r}")
            return
        if kind == "object":
            for key in self.required.get(pattern, ()):
                if key not in value:
                    out.append(f"{_join(path, key)}: required field missing")
            for key, child in value.items():
                sub = _join(pattern, str(key))
                if sub not in self.fields and _join(pattern, "*") in self.fields:
                    sub = _join(pattern, "*")
                self._walk(child, _join(path, str(key)), sub, out)
        elif kind == "array":
            for i, child in enumerate(value):
                self._walk(child, f"{path}[{i}]", f"{pattern}[]", out)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _under(prefix: str, fields: dict[str, str]) -> dict[str, str]:
    return {_join(prefix, k) if k else prefix: v for k, v in fields.items()}


# corev1.PodTemplateSpec, as the CRD inlines it (only what the manifests use).
_POD_TEMPLATE = {
    "": "object",
    "spec": "object",
    "spec.containers": "array",
    "spec.containers[]": "object",
    "spec.containers[].name": "string",
    "spec.containers[].image": "string",
    "spec.containers[].workingDir": "string",
    "spec.containers[].env": "array",
    "spec.containers[].env[]": "object",
    "spec.containers[].env[].name": "string",
    "spec.containers[].env[].value": "string",
    "spec.containers[].resources": "object",
    "spec.containers[].resources.limits": "object",
    "spec.containers[].resources.limits.*": "quantity",
    "spec.containers[].resources.requests": "object",
    "spec.containers[].resources.requests.*": "quantity",
    "spec.containers[].volumeMounts": "array",
    "spec.containers[].volumeMounts[]": "object",
    "spec.containers[].volumeMounts[].name": "string",
    "spec.containers[].volumeMounts[].mountPath": "string",
    "spec.containers[].volumeMounts[].readOnly": "boolean",
    "spec.volumes": "array",
    "spec.volumes[]": "object",
    "spec.volumes[].name": "string",
    "spec.volumes[].secret": "object",
    "spec.volumes[].secret.secretName": "string",
    "spec.volumes[].secret.items": "array",
    "spec.volumes[].secret.items[]": "object",
    "spec.volumes[].secret.items[].key": "string",
    "spec.volumes[].secret.items[].path": "string",
    "spec.volumes[].persistentVolumeClaim": "object",
    "spec.volumes[].persistentVolumeClaim.claimName": "string",
    "spec.volumes[].persistentVolumeClaim.readOnly": "boolean",
    "spec.tolerations": "array",
    "spec.tolerations[]": "object",
    "spec.tolerations[].key": "string",
    "spec.tolerations[].operator": "string",
    "spec.tolerations[].effect": "string",
}
_POD_TEMPLATE_REQUIRED = {
    "spec": ("containers",),
    "spec.containers[]": ("name",),
    "spec.containers[].env[]": ("name",),
    "spec.containers[].volumeMounts[]": ("mountPath", "name"),
    "spec.volumes[]": ("name",),
    "spec.volumes[].secret.items[]": ("key", "path"),
    "spec.volumes[].persistentVolumeClaim": ("claimName",),
}

# RayClusterSpec: RayService.spec.rayClusterConfig and RayJob.spec.rayClusterSpec.
_GROUP = {
    "rayStartParams": "object",
    "rayStartParams.*": "string",  # every value a string, even numbers: "4", "0"
}
_CLUSTER = {
    "": "object",
    "rayVersion": "string",
    "enableInTreeAutoscaling": "boolean",
    "autoscalerOptions": "object",
    "autoscalerOptions.idleTimeoutSeconds": "integer",
    "authOptions": "object",
    "authOptions.mode": "string",  # enum: disabled | token
    "authOptions.secretName": "string",
    "headGroupSpec": "object",
    **_under("headGroupSpec", _GROUP),
    **_under("headGroupSpec.template", _POD_TEMPLATE),
    "workerGroupSpecs": "array",
    "workerGroupSpecs[]": "object",
    "workerGroupSpecs[].groupName": "string",
    "workerGroupSpecs[].replicas": "integer",
    "workerGroupSpecs[].minReplicas": "integer",
    "workerGroupSpecs[].maxReplicas": "integer",
    **_under("workerGroupSpecs[]", _GROUP),
    **_under("workerGroupSpecs[].template", _POD_TEMPLATE),
}
_CLUSTER_REQUIRED = {
    "": ("headGroupSpec",),
    "headGroupSpec": ("template",),
    "workerGroupSpecs[]": ("groupName", "maxReplicas", "minReplicas", "template"),
    **{_join("headGroupSpec.template", k): v for k, v in _POD_TEMPLATE_REQUIRED.items()},
    **{_join("workerGroupSpecs[].template", k): v for k, v in _POD_TEMPLATE_REQUIRED.items()},
}

_OBJECT = {
    "": "object",
    "apiVersion": "string",
    "kind": "string",
    "metadata": "object",
    "metadata.name": "string",
    "metadata.labels": "object",
    "metadata.labels.*": "string",
    "spec": "object",
}


def _cluster_at(prefix: str) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    return (_under(prefix, _CLUSTER),
            {(_join(prefix, k) if k else prefix): v for k, v in _CLUSTER_REQUIRED.items()})


_service_cluster, _service_required = _cluster_at("spec.rayClusterConfig")
RAYSERVICE = Schema(
    fields={**_OBJECT, "spec.serveConfigV2": "string", **_service_cluster},
    required={"": ("apiVersion", "kind", "metadata", "spec"),
              "spec": ("rayClusterConfig",), **_service_required},
)

_job_cluster, _job_required = _cluster_at("spec.rayClusterSpec")
RAYJOB = Schema(
    fields={**_OBJECT,
            "spec.entrypoint": "string",
            "spec.shutdownAfterJobFinishes": "boolean",
            "spec.ttlSecondsAfterFinished": "integer",
            "spec.activeDeadlineSeconds": "integer",
            **_job_cluster},
    required={"": ("apiVersion", "kind", "metadata", "spec"), **_job_required},
)

SCHEMAS = {"RayService": RAYSERVICE, "RayJob": RAYJOB}
