"""Rendered manifests -> the pods Kubernetes would run: names, DNS names, commands, environment.

Pure (no processes, no namespaces): :func:`expand` reads the multi-document YAML that
``clusterctl render --format k8s|tfjob`` prints and returns one :class:`PodSpec` per pod, as the
controllers would make them:

- **Indexed Job** (``batch/v1`` ``Job``, ``completionMode: Indexed``): ``completions`` pods; pod
  ``i`` has host name ``{job name}-{i}``; with ``subdomain: S`` and a headless Service ``S`` in
  the same manifests whose selector matches the pod's labels, its DNS name is
  ``{host name}.S.{namespace}.svc`` (no Service, or a selector that misses: no DNS name, as on a
  cluster). The Job controller adds ``JOB_COMPLETION_INDEX`` to every container's environment
  (after the container's own variables) and the annotation
  ``batch.kubernetes.io/job-completion-index``.
- **TFJob** (``kubeflow.org/v1``): ``replicas`` pods per replica type, named
  ``{name}-{type lowercase}-{i}`` and reachable as ``{that}.{namespace}.svc`` (the controller makes
  one Service per pod). When the job is distributed (replicas of every type add up to more than
  one, the controller's ``isDistributed``), ``TF_CONFIG`` is appended to the environment of the
  container named ``tensorflow``, built as the training operator's ``genTFConfigJSONStr`` builds
  it: ``{"cluster":{TYPE:[ADDRESSES]},"task":{"type":TYPE,"index":I},"environment":"cloud"}``,
  Go's ``json.Marshal`` of its struct (fields in that order, map keys sorted, compact, ``<>&``
  escaped), addresses ``{name}-{type}-{i}.{namespace}.svc:{port}`` with the port of the
  container's ``tfjob-port`` (2222 without one).

:meth:`PodSpec.environment` resolves the container's ``env`` and ``envFrom`` as the kubelet
does: literal values with ``$(VAR)`` expansion, ``secretKeyRef`` / ``configMapKeyRef`` from the
objects a test passes, ``fieldRef`` (``metadata.name``, ``metadata.namespace``,
``metadata.labels['k']``, ``metadata.annotations['k']``, ``status.podIP``, ``status.hostIP``,
``spec.nodeName``, ``spec.serviceAccountName``), plus ``HOSTNAME``. Anything else raises
:class:`ManifestError` naming the pod and the field, so a manifest the harness cannot run
faithfully is never run approximately.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

__all__ = ["ManifestError", "PodSpec", "expand", "go_json"]

COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
TFJOB_CONTAINER = "tensorflow"
TFJOB_PORT_NAME = "tfjob-port"
TFJOB_DEFAULT_PORT = 2222
_TFJOB_TYPES = ("Chief", "Evaluator", "Master", "PS", "Worker")  # isDistributed counts these
_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")
_LABEL_PATH = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]$")


class ManifestError(ValueError):
    """The manifests cannot be turned into pods faithfully; the message names the object or pod
    and the field."""


def go_json(value: Any) -> str:
    """``value`` as Go's ``encoding/json.Marshal`` writes it: compact, keys in the order given
    (pass maps with sorted keys: Go sorts them), UTF-8, ``<``, ``>``, ``&``, U+2028 and U+2029
    escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


@dataclass(frozen=True)
class PodSpec:
    """One pod as its controller would make it.

    ``name``: the pod's name (TFJob: ``{name}-{type}-{i}``; Indexed Job: ``{job}-{i}-{suffix}``,
    the suffix fixed here); ``hostname``; ``dns_names``: the names the cluster's DNS gives it;
    ``role`` and ``index``: the replica type (TFJob, lowercase) or the ``cluster-runtime.dev/job``
    label (Indexed Job) and the pod's index; ``container``: the container spec run (the only
    one, or ``tensorflow``); ``extra_env``: what the controller adds to its environment.
    """

    name: str
    hostname: str
    namespace: str
    dns_names: tuple[str, ...]
    role: str
    index: int
    container: Mapping[str, Any] = field(repr=False)
    labels: Mapping[str, str] = field(default_factory=dict, repr=False)
    annotations: Mapping[str, str] = field(default_factory=dict, repr=False)
    extra_env: tuple[tuple[str, str], ...] = ()

    @property
    def task(self) -> str:
        """``role:index`` (``worker:1``)."""
        return f"{self.role}:{self.index}"

    @property
    def command(self) -> list[str]:
        """The container's ``command`` + ``args`` (``$(VAR)`` not expanded yet)."""
        return [str(a) for a in (self.container.get("command") or [])] + \
               [str(a) for a in (self.container.get("args") or [])]

    @property
    def working_dir(self) -> str | None:
        return self.container.get("workingDir")

    def environment(self, *, pod_ip: str,
                    secrets: Mapping[str, Mapping[str, str]] | None = None,
                    config_maps: Mapping[str, Mapping[str, str]] | None = None,
                    host_ip: str = "10.0.0.1", node: str = "node-0") -> dict[str, str]:
        """The container's environment as the kubelet builds it (see the module docstring);
        ``secrets`` / ``config_maps``: ``{object name: {key: value}}``.

        Raises:
            ManifestError: a reference to a missing object or key (not ``optional``), or a
                field the harness does not emulate.
        """
        secrets, config_maps = secrets or {}, config_maps or {}
        env: dict[str, str] = {"HOSTNAME": self.hostname}
        for source in self.container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, objects in (("secretRef", secrets), ("configMapRef", config_maps)):
                ref = source.get(kind)
                if ref is None:
                    continue
                if ref["name"] not in objects:
                    if ref.get("optional"):
                        continue
                    raise ManifestError(f"pod {self.name}: envFrom {kind} {ref['name']!r}: no "
                                        "such object was given")
                env.update({prefix + k: v for k, v in objects[ref["name"]].items()})
        fields = self._fields(pod_ip, host_ip, node)
        for var in self.container.get("env") or []:
            name = var["name"]
            if "valueFrom" not in var:
                env[name] = _expand(str(var.get("value", "")), env)
                continue
            value = self._value_from(name, var["valueFrom"], fields, secrets, config_maps)
            if value is not None:
                env[name] = value
        env.update(self.extra_env)  # appended to the list by the controller: the last wins
        return env

    def argv(self, env: Mapping[str, str]) -> list[str]:
        """:attr:`command` with ``$(VAR)`` references expanded from ``env``."""
        return [_expand(a, env) for a in self.command]

    def _fields(self, pod_ip: str, host_ip: str, node: str) -> dict[str, str]:
        return {"metadata.name": self.name, "metadata.namespace": self.namespace,
                "status.podIP": pod_ip, "status.podIPs": pod_ip, "status.hostIP": host_ip,
                "spec.nodeName": node, "spec.serviceAccountName": "default"}

    def _value_from(self, name: str, source: Mapping[str, Any], fields: Mapping[str, str],
                    secrets: Mapping[str, Mapping[str, str]],
                    config_maps: Mapping[str, Mapping[str, str]]) -> str | None:
        where = f"pod {self.name}: env {name}"
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path in fields:
                return fields[path]
            match = _LABEL_PATH.match(path)
            if match:
                table = self.labels if match.group(1) == "labels" else self.annotations
                return table.get(match.group(2), "")
            raise ManifestError(f"{where}: fieldRef {path!r} is not emulated")
        for kind, objects, what in (("secretKeyRef", secrets, "Secret"),
                                    ("configMapKeyRef", config_maps, "ConfigMap")):
            if kind in source:
                ref = source[kind]
                value = objects.get(ref["name"], {}).get(ref["key"])
                if value is None and not ref.get("optional"):
                    raise ManifestError(f"{where}: {what} {ref['name']!r} key {ref['key']!r} "
                                        "was not given (the pod would not start)")
                return value
        raise ManifestError(f"{where}: valueFrom {sorted(source)} is not emulated")


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables are replaced, ``$$`` is ``$``, an
    undefined reference stays as written."""
    def sub(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _REF.sub(sub, text)


def _single_container(where: str, template: Mapping[str, Any], name: str | None = None
                      ) -> Mapping[str, Any]:
    containers = (template.get("spec") or {}).get("containers") or []
    if name is not None:
        named = [c for c in containers if c.get("name") == name]
        if len(named) != 1:
            raise ManifestError(f"{where}: needs one container named {name!r}, has "
                                f"{[c.get('name') for c in containers]}")
        return named[0]
    if len(containers) != 1:
        raise ManifestError(f"{where}: the harness runs one container per pod, found "
                            f"{len(containers)}")
    return containers[0]


def _selects(selector: Mapping[str, str] | None, labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _indexed_job(doc: Mapping[str, Any], services: Mapping[tuple[str, str], Mapping[str, Any]]
                 ) -> list[PodSpec]:
    meta, spec = doc["metadata"], doc["spec"]
    name, namespace = meta["name"], meta.get("namespace", "default")
    if spec.get("completionMode") != "Indexed":
        raise ManifestError(f"Job {name}: only Indexed Jobs are emulated")
    template = spec["template"]
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    container = _single_container(f"Job {name}", template)
    subdomain = (template.get("spec") or {}).get("subdomain")
    service = services.get((namespace, subdomain)) if subdomain else None
    published = service is not None and _selects(service.get("selector"), labels)
    role = labels.get("cluster-runtime.dev/job", name)
    # The Job controller adds the index variable unless the container sets it itself.
    has_index = any(v.get("name") == COMPLETION_INDEX for v in container.get("env") or [])
    pods = []
    for i in range(int(spec.get("completions", 1))):
        hostname = f"{name}-{i}"
        dns = (f"{hostname}.{subdomain}.{namespace}.svc",) if published else ()
        pods.append(PodSpec(
            name=f"{hostname}-pod", hostname=hostname, namespace=namespace, dns_names=dns,
            role=role, index=i, container=container, labels=labels,
            annotations={INDEX_ANNOTATION: str(i)},
            extra_env=() if has_index else ((COMPLETION_INDEX, str(i)),)))
    return pods


def _tfjob_port(where: str, template: Mapping[str, Any]) -> int:
    container = _single_container(where, template, TFJOB_CONTAINER)
    for port in container.get("ports") or []:
        if port.get("name") == TFJOB_PORT_NAME:
            return int(port["containerPort"])
    return TFJOB_DEFAULT_PORT


def _tfjob(doc: Mapping[str, Any]) -> list[PodSpec]:
    meta = doc["metadata"]
    name, namespace = meta["name"], meta.get("namespace", "default")
    replica_specs = doc["spec"]["tfReplicaSpecs"]
    counts = {rtype: int(spec.get("replicas", 1)) for rtype, spec in replica_specs.items()}
    distributed = sum(n for rtype, n in counts.items() if rtype in _TFJOB_TYPES) != 1
    cluster = {}
    for rtype in sorted(replica_specs, key=str.lower):  # Go's json.Marshal sorts map keys
        rt = rtype.lower()
        port = _tfjob_port(f"TFJob {name} {rtype}", replica_specs[rtype]["template"])
        cluster[rt] = [f"{name}-{rt}-{i}.{namespace}.svc:{port}" for i in range(counts[rtype])]
    pods = []
    for rtype, spec in replica_specs.items():
        rt = rtype.lower()
        template = spec["template"]
        container = _single_container(f"TFJob {name} {rtype}", template, TFJOB_CONTAINER)
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        for i in range(counts[rtype]):
            pod = f"{name}-{rt}-{i}"
            extra = ()
            if distributed:
                tf_config = go_json({"cluster": cluster, "task": {"type": rt, "index": i},
                                     "environment": "cloud"})
                extra = (("TF_CONFIG", tf_config),)
            pods.append(PodSpec(
                name=pod, hostname=pod, namespace=namespace,
                dns_names=(f"{pod}.{namespace}.svc",), role=rt, index=i, container=container,
                labels=labels, extra_env=extra))
    return pods


def expand(manifests: str) -> list[PodSpec]:
    """Every pod the controllers would make from ``manifests`` (multi-document YAML), in the
    order of the documents. Services and Secrets are read, other kinds are refused.

    Raises:
        ManifestError: an object the harness does not emulate, or a pod it cannot run.
    """
    docs = [d for d in yaml.safe_load_all(manifests) if d]
    services = {(d["metadata"].get("namespace", "default"), d["metadata"]["name"]): d["spec"]
                for d in docs if d.get("kind") == "Service"}
    for (namespace, name), spec in services.items():
        if spec.get("clusterIP") != "None":
            raise ManifestError(f"Service {namespace}/{name}: only headless Services give pods "
                                "DNS names")
    pods: list[PodSpec] = []
    for doc in docs:
        kind = doc.get("kind")
        if kind == "Job":
            pods += _indexed_job(doc, services)
        elif kind == "TFJob":
            pods += _tfjob(doc)
        elif kind not in ("Service", "Secret"):
            raise ManifestError(f"{kind} {doc.get('metadata', {}).get('name')}: not emulated")
    names = [p.hostname for p in pods]
    if len(set(names)) != len(names):
        raise ManifestError(f"two pods share a host name: {sorted(names)}")
    return pods

