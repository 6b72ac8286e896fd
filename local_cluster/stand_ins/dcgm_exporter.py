"""Stand-in for NVIDIA's DCGM exporter on a local node, which has no GPU: the same metric names, labels
and port (9400), for a few fake GPUs, so the alert rules and dashboards read it as they read the real one.

    python -m local_cluster.stand_ins.dcgm_exporter --hostname node1 --listen 10.199.77.11:9400 \\
        --faults .local_cluster/fsx/.node-health/node1.xid

Faults are injected through the ``--faults`` file, read at every scrape, one a line: ``GPU XID``
(``3 79``: GPU 3 fell off the bus) or ``GPU temp C`` (``2 temp 91``: GPU 2 runs at 91 C).
``DCGM_FI_DEV_XID_ERRORS`` is each GPU's last XID (0: none), as DCGM reports it; XID 48 (a double-bit
ECC error) also counts one in ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``. Delete the file and the GPUs are healthy
again. Without a fault the temperature is an idle 30-33 C; utilisation and memory are fixed idle values.
"""

from __future__ import annotations

import re
import sys
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cli import ArgumentParser

DBE_XID = 48
METRICS = (  # name, help (DCGM's own wording), value for GPU i with faults f ({"xid": last XID, "temp": C})
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", lambda i, f: f.get("xid", 0)),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda i, f: f.get("temp", 30 + i)),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda i, f: 0),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda i, f: 0),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.",
     lambda i, f: int(f.get("xid") == DBE_XID)),
)
FAULT = re.compile(r"^\s*(\d+)\s+(?:(temp)\s+)?(\d+)\s*$")


def read_faults(path: Path) -> dict[int, dict[str, int]]:
    """GPU index -> its faults ({"xid": last XID, "temp": C}), from the fault file (absent: none;
    malformed lines are ignored)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    faults: dict[int, dict[str, int]] = {}
    for m in filter(None, map(FAULT.match, lines)):
        faults.setdefault(int(m[1]), {})[m[2] or "xid"] = int(m[3])
    return faults


def render(hostname: str, gpus: int, faults: dict[int, dict[str, int]]) -> str:
    out = []
    for name, help_text, value in METRICS:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for i in range(gpus):
            gpu_uuid = f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{hostname}.gpu{i}')}"
            labels = (f'gpu="{i}",UUID="{gpu_uuid}",device="nvidia{i}",modelName="NVIDIA A10G (stand-in)",'
                      f'Hostname="{hostname}"')
            out.append(f"{name}{{{labels}}} {value(i, faults.get(i, {}))}")
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
