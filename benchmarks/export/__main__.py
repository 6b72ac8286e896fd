"""Peak memory of the Hugging Face export (training/export_hf.py), measured at small widths and
carried over to llama2-70b's shapes without allocating them.

    .venv/bin/python -m benchmarks.export [--vocab 4096 16384] [--out benchmarks/results/export.json]

Per vocabulary: a synthetic fp32 DCP checkpoint of the "small" preset (8 layers, width 512; its
embedding is the largest tensor and grows with the vocabulary while the rest stays put), exported to
bf16 in a process of its own; the figure is that process's peak resident memory (VmHWM, reset after
the imports) above its resident memory before the export. A straight line through the points gives
bytes of peak per byte of the largest tensor and a constant; applied to llama2-70b's largest tensor
(its 32000 x 8192 embedding, fp32 in the checkpoint) it gives 70B's figure. Writes JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "jobs")]

import numpy  # noqa: E402
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from cli import ArgumentParser  # noqa: E402
from training.export_hf import weight_shapes  # noqa: E402
from training.models import hf_config  # noqa: E402

PRESET, SEQ_LEN = "small", 128
TARGET = ("llama2-70b", 32000)  # Llama 2's tokenizer

# Runs in a fresh interpreter: the peak of this process is the export's alone.
MEASURE = """
import json, sys
from pathlib import Path
from training.export_hf import write_weights
from training.models import hf_config

def status(field):
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024

open("/proc/self/clear_refs", "w").write("5")  # the peak from here on, not the imports'
before = status("VmRSS")
write_weights(Path(sys.argv[1]), Path(sys.argv[2]), hf_config(sys.argv[3], int(sys.argv[4]), 128))
print(json.dumps({"before": before, "peak": status("VmHWM")}))
"""


def sizes(preset: str, vocab: int) -> tuple[int, int]:
    """(largest tensor, whole model) in bytes, fp32 as training saves them; shapes on the meta device."""
    numels = [shape.numel() for shape in weight_shapes(hf_config(preset, vocab, SEQ_LEN)).values()]
    return max(numels) * 4, sum(numels) * 4


def measure(vocab: int, work: Path) -> dict:
    config = hf_config(PRESET, vocab, SEQ_LEN)
    checkpoint, out = work / f"ckpt_{vocab}", work / f"hf_{vocab}"
    out.mkdir()
    state = {name: torch.randn(shape) for name, shape in weight_shapes(config).items()}
    dcp.save({"model": state}, checkpoint_id=checkpoint, no_dist=True)
    del state
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(checkpoint), str(out), PRESET, str(vocab)],
                          env={**os.environ, "PYTHONPATH": str(REPO / "jobs")},
                          capture_output=True, text=True, check=True)
    rss = json.loads(proc.stdout.splitlines()[-1])
    largest, total = sizes(PRESET, vocab)
    return {"preset": PRESET, "vocab": vocab, "largest_tensor_bytes": largest, "model_bytes": total,
            "peak_bytes": rss["peak"] - rss["before"]}


def main() -> int:
    parser = ArgumentParser(prog="python -m benchmarks.export", description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[4096, 16384],
                        help="one export per vocabulary size; two or more give the 70B figure")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/export.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        measured = [measure(vocab, Path(work)) for vocab in args.vocab]
    for m in measured:
        print(f"{m['preset']} vocab {m['vocab']}: model {m['model_bytes'] / 2**20:.0f} MiB, largest tensor "
              f"{m['largest_tensor_bytes'] / 2**20:.0f} MiB, export peak {m['peak_bytes'] / 2**20:.0f} MiB")
    result = {"measured": measured}
    if len({m["vocab"] for m in measured}) >= 2:
        slope, constant = numpy.polyfit([m["largest_tensor_bytes"] for m in measured],
                                        [m["peak_bytes"] for m in measured], 1)
        largest, total = sizes(*TARGET)
        peak = slope * largest + constant
        result["llama2-70b"] = {"vocab": TARGET[1], "largest_tensor_bytes": largest, "model_bytes": total,
                                "peak_per_largest_tensor_byte": round(slope, 3), "constant_bytes": round(constant),
                                "predicted_peak_bytes": round(peak)}
        print(f"llama2-70b: model {total / 2**30:.0f} GiB in fp32, largest tensor {largest / 2**30:.2f} GiB: "
              f"export peak ~{peak / 2**30:.1f} GiB ({slope:.2f} x largest + {constant / 2**20:.0f} MiB)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
