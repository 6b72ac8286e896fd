"""The local cluster's alert receiver: Alertmanager's webhook, standing in for the SNS topic that tells a
person on AWS (stacks/alerts_stack.py).

    python -m local_cluster.alert_receiver --listen 127.0.0.1:19094 \\
        --jsonl .local_cluster/log/alerts.jsonl --log .local_cluster/log/alerts.log

Every notification Alertmanager POSTs is appended as it came, plus ``received`` (epoch seconds), as one
line to ``--jsonl``; each alert in it also gets one line in ``--log``:

    2025-01-01T12:00:00Z FIRING   TrainingCrashLooping model=model1 severity=page: model1 restarted 3 times in 10 min
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cli import ArgumentParser

# In every alert, or where it came from, or said again by the summary.
QUIET_LABELS = {"alertname", "job", "instance", "UUID", "device", "modelName"}


def summary(alert: dict, received: float) -> str:
    """One line for one alert of a notification."""
    labels = alert.get("labels", {})
    rest = " ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in QUIET_LABELS)
    annotations = alert.get("annotations", {})
    text = annotations.get("summary") or annotations.get("description") or ""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(received))
    line = f"{stamp} {alert.get('status', '?').upper():8} {labels.get('alertname', '?')}"
    return line + (f" {rest}" if rest else "") + (f": {text}" if text else "")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m local_cluster.alert_receiver", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, metavar="ADDRESS:PORT")
    parser.add_argument("--jsonl", required=True, type=Path, help="every notification, one JSON line each")
    parser.add_argument("--log", required=True, type=Path, help="one summary line per alert")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        parser.error(f"--listen {args.listen}: expected ADDRESS:PORT")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received = time.time()
            try:
                payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            except ValueError as exc:
                self.send_error(400, f"not JSON: {exc}")
                return
            with lock:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps({"received": received, **payload}) + "\n")
                with open(args.log, "a") as f:
                    f.writelines(summary(a, received) + "\n" for a in payload.get("alerts", []))
            self.send_response(200)
            self.end_headers()

        def do_GET(self):  # liveness for cluster.sh up
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_):
            pass

    args.jsonl.parent.mkdir(parents=True, exist_ok=True)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    ThreadingHTTPServer((host, int(port)), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
