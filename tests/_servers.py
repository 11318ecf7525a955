"""Real servers for tests: free localhost ports, an `mlflow server` stopped by its process group, and
moto's S3-compatible server (a thread of the test process) stopped by its handle."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict


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


#: fake credentials of the test S3 server; the secret is distinctive so tests can search logs for it
FAKE_ACCESS_KEY_ID = "AKIARAYEMBTESTKEY000"
FAKE_SECRET_ACCESS_KEY = "rayemb-fake-secret-Zq8wX3vN5tL1pK7d"


class MotoS3Server:
    """moto's S3 server on 127.0.0.1, on a free port, in a thread of this process; ``stop()`` ends it.

    ``env`` is what a process needs to reach it with pyarrow or boto3: fake credentials,
    a region and ``AWS_ENDPOINT_URL``. Nothing leaves 127.0.0.1, unless ``host`` names another local address
    (the bridge of an emulated cluster, which its network namespaces reach the host on).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = None
        self.host, self.port = host, port
        self.endpoint = ""

    def start(self) -> "MotoS3Server":
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        return self

    @property
    def env(self) -> Dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_ACCESS_KEY,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=FAKE_ACCESS_KEY_ID, aws_secret_access_key=FAKE_SECRET_ACCESS_KEY)

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def keys(self, bucket: str, prefix: str = "") -> list:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
