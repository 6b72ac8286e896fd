"""A real S3 API server for tests: moto_server on a free port of a local address (the AWS boundary)."""

from __future__ import annotations

import pwd
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from cluster_config.emulated.moto_server import stop

# Fake credentials and no instance metadata lookups: boto3 must talk to the local server only.
FAKE_AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


@contextmanager
def s3_server(host: str = "127.0.0.1") -> Iterator[str]:
    """Run moto_server on ``host`` until the block ends; yields its endpoint URL once it accepts connections."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", host, "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Its imports take 2-3 s alone; a 2-core machine running the whole suite has taken over 20.
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection((host, port), timeout=0.2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {host}:{port}") from None
                time.sleep(0.1)
        yield f"http://{host}:{port}"
    finally:
        stop(server)


def aws_config(user: str, url: str, key: str = "testing", secret: str = "testing") -> Path:
    """``user``'s ~/.aws for the S3 server at ``url`` (on AWS: the instance profile, and S3's own endpoint)."""
    aws = Path(pwd.getpwnam(user).pw_dir) / ".aws"
    aws.mkdir(exist_ok=True)
    (aws / "config").write_text(f"[default]\nregion = us-east-1\nendpoint_url = {url}\n")
    (aws / "credentials").write_text(f"[default]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n")
    for path in (aws, *aws.iterdir()):
        shutil.chown(path, user)
    return aws
