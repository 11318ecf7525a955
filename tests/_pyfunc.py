"""The logged pyfunc model scored in a new Python process, as a serving host would load it.

``fresh_pyfunc`` runs ``mlflow.pyfunc.load_model(model_uri).predict(frame, params=...)`` for each request in
one new process (nothing cached from the test's own imports) and returns every output column as lists.
A request is ``{"params": {...} or None, "frame": {column: values} or None}``: its frame, or the rows of
the parquet files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Sequence

SCRIPT = """
import json, sys
import mlflow, pandas, pyarrow.parquet as pq
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
rows = pq.read_table(sys.argv[4:]).to_pandas()
out = []
for request in json.loads(sys.argv[3]):
    frame = pandas.DataFrame(request["frame"]) if request.get("frame") else rows
    got = model.predict(frame, params=request.get("params"))
    out.append({c: [v if isinstance(v, float) else list(map(float, v)) for v in got[c].tolist()] for c in got.columns})
print("RESULT=" + json.dumps(out))
"""


def fresh_pyfunc(uri: str, model_uri: str, files: Sequence[str], requests: List[Dict[str, Any]],
                 cwd: str) -> List[Dict[str, list]]:
    """The pyfunc's output frames (column -> values, vectors as lists) of ``requests``, in a new process."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    p = subprocess.run([sys.executable, "-c", SCRIPT, uri, model_uri, json.dumps(requests), *files],
                       capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT=")][-1]
    return json.loads(line[len("RESULT="):])
