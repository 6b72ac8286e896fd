"""Stand-in for NVIDIA's DCGM exporter on a local node, which has no GPU: the same metric names, labels
and port (9400), for a few fake GPUs, so the alert rules and dashboards read it as they read the real one.

    python -m local_cluster.stand_ins.dcgm_exporter --hostname node1 --listen 10.199.77.11:9400 \\
        --faults .local_cluster/fsx/.node-health/node1.xid

Faults are injected through the ``--faults`` file, read at every scrape, one a line: ``GPU XID``
(``3 79``: GPU 3 fell off the bus; several lines, several Xids) or ``GPU temp C`` (``2 temp 91``: GPU 2
runs at 91 C). ``DCGM_EXP_XID_ERRORS_COUNT`` counts each GPU's Xids by code, as the DCGM exporter does over
its window (the file is the window): one series per GPU and code, or one without ``xid``, 0, for a GPU with
none. Each XID 48 (a double-bit ECC error) also counts one in ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``. Delete the
file and the GPUs are healthy again. Without a fault the temperature is an idle 30-33 C; utilisation and
memory are fixed idle values.
"""

from __future__ import annotations

import re
import sys
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cli import ArgumentParser

DBE_XID = 48
WINDOW_MS = 300000  # the DCGM exporter's default --xid-count-window-size, a label of its Xid counts
XIDS = "DCGM_EXP_XID_ERRORS_COUNT"
# name, Prometheus type, help (the DCGM exporter's own wording), value(s) for GPU i with faults f
# ({"xids": Counter of XIDs, "temp": C}): a number, or {extra labels: number} for one series each.
METRICS = (
    (XIDS, "gauge", "Count of XID Errors within user-specified time window (see xid-count-window-size param).",
     lambda i, f: {f',xid="{x}"': n for x, n in sorted(f["xids"].items())} if f.get("xids") else {"": 0}),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda i, f: f.get("temp", 30 + i)),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda i, f: 0),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda i, f: 0),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
     lambda i, f: f.get("xids", Counter())[DBE_XID]),
)
FAULT = re.compile(r"^\s*(\d+)\s+(?:(temp)\s+)?(\d+)\s*$")


def read_faults(path: Path) -> dict[int, dict]:
    """GPU index -> its faults ({"xids": Counter of XIDs, "temp": C}), from the fault file (absent: none;
    malformed lines are ignored)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    faults: dict[int, dict] = {}
    for m in filter(None, map(FAULT.match, lines)):
        gpu = faults.setdefault(int(m[1]), {"xids": Counter()})
        if m[2]:
            gpu["temp"] = int(m[3])
        else:
            gpu["xids"][int(m[3])] += 1
    return faults


def render(hostname: str, gpus: int, faults: dict[int, dict]) -> str:
    out = []
    for name, kind, help_text, value in METRICS:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for i in range(gpus):
            gpu_uuid = f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{hostname}.gpu{i}')}"
            labels = (f'gpu="{i}",UUID="{gpu_uuid}",device="nvidia{i}",modelName="NVIDIA A10G (stand-in)",'
                      f'Hostname="{hostname}"')
            if name == XIDS:
                labels += f',window_size_in_ms="{WINDOW_MS}"'
            values = value(i, faults.get(i, {}))
            for extra, number in (values.items() if isinstance(values, dict) else [("", values)]):
                out.append(f"{name}{{{labels}{extra}}} {number}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m local_cluster.stand_ins.dcgm_exporter", description=__doc__.splitlines()[0])
    parser.add_argument("--hostname", required=True, help="the node's name (label Hostname)")
    parser.add_argument("--listen", required=True, metavar="ADDRESS:PORT")
    parser.add_argument("--faults", required=True, type=Path,
                        help="file of 'GPU XID' and 'GPU temp C' lines, read at every scrape")
    parser.add_argument("--gpus", type=int, default=4, help="fake GPUs (dev's g5.12xlarge has 4)")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        parser.error(f"--listen {args.listen}: expected ADDRESS:PORT")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics")
                return
            body = render(args.hostname, args.gpus, read_faults(args.faults)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):  # a scrape every 5 s: no access log
            pass

    ThreadingHTTPServer((host, int(port)), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
