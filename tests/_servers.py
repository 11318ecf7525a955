"""Real servers for tests: free localhost ports and an `mlflow server` stopped by its process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """`mlflow server` on 127.0.0.1:port in its own process group (it forks uvicorn workers)."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port, self.proc = root, port, None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        mlflow_bin = Path(sys.executable).parent / "mlflow"
        cmd = [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
               "--backend-store-uri", f"sqlite:///{self.root.resolve()}/db.sqlite",
               "--artifacts-destination", str(self.root.resolve() / "artifacts")]
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        env.pop("MLFLOW_TRACKING_URI", None)
        self.log = open(self.root / f"server-{time.time():.0f}.log", "ab")
        self.proc = subprocess.Popen(cmd, cwd=self.root, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=0.5) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_healthy(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            assert self.proc.poll() is None, f"mlflow server exited: {self.log.name}"
            assert time.monotonic() < deadline, f"mlflow server not up after {timeout_s} s"
            time.sleep(0.25)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group we created: server + its uvicorn worker
            self.proc.wait(timeout=30)
        self.proc = None
