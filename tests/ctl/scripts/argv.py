"""Test task: prints its task and its arguments as JSON (``ARGV chief:0 ["--epochs", "3"]``)."""

import json
import os
import sys

task = json.loads(os.environ["TF_CONFIG"])["task"]
print(f"ARGV {task['type']}:{task['index']} {json.dumps(sys.argv[1:])}", flush=True)
