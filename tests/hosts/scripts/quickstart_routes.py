"""Host test task: the quickstart's training (``examples/quickstart/train.py``, same arguments),
then the routes its MultiWorkerMirroredStrategy's collectives took.

Prints ``ROUTES task=... hosts=... routes={...}`` after training: the strategy's collective
group's topology and :attr:`CollectiveGroup.route_counts`, the proof of which path ran.
"""

import importlib.util
import json
import sys
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart" / "train.py"
spec = importlib.util.spec_from_file_location("quickstart_train", QUICKSTART)
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)

made = []
make_strategy = train.make_strategy


def capture(name, replicas):
    made.append(make_strategy(name, replicas))
    return made[-1]


train.make_strategy = capture
code = train.main(sys.argv[1:])
strategy = made[0]
# The strategy's collective group: no public accessor, this test reads it through its ops.
group = strategy.extended._cross_device_ops.group
resolver = strategy.cluster_resolver
hosts = [list(h) for h in group.topology.hosts] if group.topology is not None else None
print(f"ROUTES task={resolver.task_type}:{resolver.task_id} hosts={json.dumps(hosts)} "
      f"routes={json.dumps(group.route_counts, sort_keys=True)}", flush=True)
sys.exit(code)
