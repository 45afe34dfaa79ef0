"""The cluster file's ``resources:`` section: per job, what each of its pods requests on
Kubernetes, validated like every other key (file, line, key, hint).

Shape: ``resources: {worker: {cpu: "2", memory: 4Gi, nvidia.com/gpu: 1}}``. Values are
Kubernetes quantities (``500m``, ``2``, ``4Gi``, ``1e3``); the renderers use them as both
requests and limits. ``clusterctl launch`` ignores the section (one host, no scheduler).
"""

from __future__ import annotations

import difflib
import re

from cluster._placement import JOB_NAMES
from cluster.ctl._checker import Checker, kind_of
from cluster.ctl._yaml import Located

__all__ = ["RESOURCE_NAMES", "parse_resources"]

RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage", "nvidia.com/gpu", "amd.com/gpu")
# Kubernetes' quantity grammar (k8s.io/apimachinery resource.Quantity), without a sign: a
# request is never negative.
_QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_ALIASES = {"gpu": "nvidia.com/gpu", "gpus": "nvidia.com/gpu", "nvidia/gpu": "nvidia.com/gpu",
            "mem": "memory", "storage": "ephemeral-storage", "disk": "ephemeral-storage"}
_EXAMPLE = 'e.g. resources: {worker: {cpu: "2", memory: 4Gi, nvidia.com/gpu: 1}}'


def _name_hint(name: str) -> str:
    close = _ALIASES.get(name.lower()) or next(
        iter(difflib.get_close_matches(name, RESOURCE_NAMES, n=1, cutoff=0.6)), None)
    return f'did you mean "{close}"?' if close else f"known: {', '.join(RESOURCE_NAMES)}"


def _quantity(c: Checker, item: Located, key: str, name: str) -> str | None:
    value = item.value
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        c.add(item.line, key, f"expected a quantity, got {kind_of(value)}",
              'e.g. "500m" or 2 (cpu), 4Gi (memory), 1 (GPUs)')
        return None
    text = str(value)
    match = _QUANTITY.match(text)
    if match is None:
        hint = ("binary units are Ki, Mi, Gi, Ti; decimal k, M, G, T: e.g. 4Gi"
                if re.match(r"^\d+(\.\d+)?\s*[a-zA-Z]+$", text) else
                'a number with an optional unit, e.g. "500m", 2, 4Gi')
        c.add(item.line, key, f"{text!r} is not a Kubernetes quantity", hint)
        return None
    if float(match.group(1)) == 0:
        c.add(item.line, key, "must be more than 0", "leave the resource out to ask for none")
        return None
    if name == "memory" and match.group(3) == "m":
        c.add(item.line, key, f"{text!r} is {match.group(1)} thousandths of a byte",
              f'did you mean "{match.group(1)}Mi"?')
        return None
    if "/" in name and (match.group(3) or not match.group(1).isdigit()):
        c.add(item.line, key, f"{text!r}: {name} counts whole devices",
              "use a whole number, e.g. 1")
        return None
    return text


def parse_resources(c: Checker, node: Located) -> dict[str, dict[str, str]] | None:
    """``{job: {resource: quantity}}`` (file order), adding a problem for every bad key or
    value; ``None`` when the section is not a mapping of jobs."""
    jobs = c.mapping(node, "resources", JOB_NAMES, "job names to resources")
    if jobs is None:
        return None
    out: dict[str, dict[str, str]] = {}
    for job, job_node in jobs.items():
        if job not in JOB_NAMES:
            continue  # reported by mapping() with a suggestion
        key = f"resources.{job}"
        if not isinstance(job_node.value, dict):
            c.add(job_node.line, key, f"expected a mapping of resources, got "
                  f"{kind_of(job_node.value)}", _EXAMPLE)
            continue
        wanted: dict[str, str] = {}
        for name, item in job_node.value.items():
            line = job_node.key_lines[name]
            if name not in RESOURCE_NAMES:
                c.add(line, f"{key}.{name}", f"unknown resource {name!r}", _name_hint(name))
                continue
            quantity = _quantity(c, item, f"{key}.{name}", name)
            if quantity is not None:
                wanted[name] = quantity
        if wanted:
            out[job] = wanted
    return out
