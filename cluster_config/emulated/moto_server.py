"""The emulated AWS account: moto's server on a loopback port, with the gaps of stubs.MOTO_GAPS filled.

    with running() as endpoint:      # http://127.0.0.1:<port>, fake credentials in FAKE_AWS_ENV
        boto3.client("ec2", endpoint_url=endpoint, ...)

``python -m cluster_config.emulated.moto_server -H 127.0.0.1 -p PORT`` is the server process itself.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator

# Fake credentials and no instance metadata lookups: clients must talk to the local server only.
FAKE_AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_SESSION_TOKEN": "testing", "AWS_EC2_METADATA_DISABLED": "true"}


@contextmanager
def running(account: str = "123456789012", host: str = "127.0.0.1", timeout: float = 30) -> Iterator[str]:
    """Serve the emulated account (id ``account``) until the block ends; yields its endpoint URL."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    # The server logs every request: a file, not a pipe nobody reads, so a long test cannot fill it and stall the server.
    log = tempfile.TemporaryFile()
    server = subprocess.Popen(
        [sys.executable, "-m", "cluster_config.emulated.moto_server", "-H", host, "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=log,
        # AWS managed policies exist in every account: load moto's copy of them.
        env={**os.environ, **FAKE_AWS_ENV, "MOTO_IAM_LOAD_MANAGED_POLICIES": "true", "MOTO_ACCOUNT_ID": account},
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection((host, port), timeout=0.2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    server.kill()
                    server.wait()
                    log.seek(0)
                    raise RuntimeError(f"moto_server did not start on {host}:{port}: {log.read().decode()[-2000:]}") from None
                time.sleep(0.1)
        yield f"http://{host}:{port}"
    finally:
        stop(server)
        log.close()


def stop(server: subprocess.Popen, grace: float = 10) -> None:
    """End a moto server: SIGTERM, then SIGKILL after ``grace`` seconds.

    moto's SIGTERM handler exits through the server's main thread, which a busy machine can hold past
    10 s (met in CI); an emulated account holds nothing worth a clean exit."""
    server.terminate()
    try:
        server.wait(grace)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


if __name__ == "__main__":
    from moto.server import main

    from cluster_config.emulated.stubs import patch_moto

    patch_moto()
    main(sys.argv[1:])
