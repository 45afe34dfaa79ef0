"""``clusterctl render --format tf-config``: every task's ``TF_CONFIG``, one line per task
(``TASK<TAB>JSON``), or only the JSON of one task (``--task TYPE:INDEX``). In an elastic run
each chief and worker line has a third field, the variable the task also needs:
``TASK<TAB>JSON<TAB>CLUSTER_ELASTIC=MIN:MAX``.

Jobs given as a count get consecutive ports from ``port_base`` (:data:`PORT_BASE` when the file
sets none) on ``host``; jobs given as a list keep their addresses.
"""

from __future__ import annotations

import dataclasses

from cluster.ctl._elastic import ELASTIC_JOBS, ENV_ELASTIC
from cluster.ctl.render.api import RenderError, RenderOptions
from cluster.ctl.spec import ClusterFile
from cluster.ctl.task_config import assign_addresses, tf_config

__all__ = ["PORT_BASE", "render"]

PORT_BASE = 2222


def render(spec: ClusterFile, options: RenderOptions) -> str:
    """The lines to print; :class:`RenderError` when ``options.task`` names no task."""
    if spec.port_base is None:
        spec = dataclasses.replace(spec, port_base=PORT_BASE)
    addresses = assign_addresses(spec)
    configs = {f"{job}:{i}": tf_config(addresses, job, i) for job, i in spec.tasks()}
    if options.task is not None:
        if options.task not in configs:
            raise RenderError(f"no task {options.task!r} in {spec.path}; tasks are "
                              f"{', '.join(configs)}")
        return configs[options.task] + "\n"
    extra = {f"{job}:{i}": f"\t{ENV_ELASTIC}={spec.elastic}" for job, i in spec.tasks()
             if spec.elastic is not None and job in ELASTIC_JOBS}
    return "".join(f"{task}\t{text}{extra.get(task, '')}\n" for task, text in configs.items())
