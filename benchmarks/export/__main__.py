"""Peak memory of the Hugging Face export (training/export_hf.py), measured at small widths and
carried over to the 70B models' shapes (llama2-70b, llama3.1-70b) without allocating them.

    .venv/bin/python -m benchmarks.export [--vocab 4096 16384 65536] [--dtype bfloat16 float32]
        [--out benchmarks/results/export.json]

Per vocabulary: a synthetic fp32 DCP checkpoint of the "small" preset (8 layers, width 512; its
embedding is the largest tensor and grows with the vocabulary while the rest stays put), exported to
each dtype (bf16, the default export, and fp32) in a process of its own; the figure is that
process's peak resident memory (VmHWM, reset after the imports) above its resident memory before
the export (the interpreter with torch and transformers, also recorded). The checkpoint is saved by
one process, one chunk per tensor: DCP reads each tensor in one piece, the worst case (a sharded
checkpoint's tensors are read chunk by chunk). A straight line
through the points gives bytes of peak per byte of the largest tensor and a constant, set beside the
model's size; applied to each 70B target's largest tensor (its embedding, fp32 in the checkpoint:
llama2-70b 32000 x 8192, 0.98 GiB; llama3.1-70b 128256 x 8192, 3.9 GiB) it gives that model's figure,
an extrapolation, not a 70B run. Writes JSON.
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
from training.models.llama import hf_config  # noqa: E402

PRESET, SEQ_LEN = "small", 128
TARGETS = {"llama2-70b": 32000, "llama3.1-70b": 128256}  # the 70B models and their tokenizers' vocabularies

# Runs in a fresh interpreter: the peak of this process is the export's alone.
MEASURE = """
import json, sys
from pathlib import Path
from training.export_hf import write_weights
from training.models.llama import hf_config

def status(field):
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024

open("/proc/self/clear_refs", "w").write("5")  # the peak from here on, not the imports'
before = status("VmRSS")
write_weights(Path(sys.argv[1]), Path(sys.argv[2]), hf_config(sys.argv[3], int(sys.argv[4]), 128), sys.argv[5])
print(json.dumps({"before": before, "peak": status("VmHWM")}))
"""


def sizes(preset: str, vocab: int) -> tuple[int, int]:
    """(largest tensor, whole model) in bytes, fp32 as training saves them; shapes on the meta device."""
    numels = [shape.numel() for shape in weight_shapes(hf_config(preset, vocab, SEQ_LEN)).values()]
    return max(numels) * 4, sum(numels) * 4


def measure(vocab: int, dtypes: list[str], work: Path) -> list[dict]:
    """One checkpoint of the vocabulary, exported to each dtype by a fresh process: its peak above its start."""
    config = hf_config(PRESET, vocab, SEQ_LEN)
    checkpoint = work / f"ckpt_{vocab}"
    state = {name: torch.randn(shape) for name, shape in weight_shapes(config).items()}
    dcp.save({"model": state}, checkpoint_id=checkpoint, no_dist=True)
    del state
    largest, total = sizes(PRESET, vocab)
    measured = []
    for dtype in dtypes:
        out = work / f"hf_{vocab}_{dtype}"
        out.mkdir()
        proc = subprocess.run([sys.executable, "-c", MEASURE, str(checkpoint), str(out), PRESET, str(vocab), dtype],
                              env={**os.environ, "PYTHONPATH": str(REPO / "jobs")},
                              capture_output=True, text=True, check=True)
        rss = json.loads(proc.stdout.splitlines()[-1])
        peak = rss["peak"] - rss["before"]
        measured.append({"preset": PRESET, "vocab": vocab, "dtype": dtype, "largest_tensor_bytes": largest,
                         "model_bytes": total, "peak_bytes": peak, "peak_per_largest_tensor": round(peak / largest, 3),
                         "peak_per_model": round(peak / total, 4), "interpreter_bytes": rss["before"]})
    return measured


def main() -> int:
    parser = ArgumentParser(prog="python -m benchmarks.export", description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[4096, 16384, 65536],
                        help="one checkpoint per vocabulary size; two or more give the 70B figures")
    parser.add_argument("--dtype", nargs="+", choices=("bfloat16", "float32"), default=["bfloat16", "float32"],
                        help="the exports' dtypes, one export of each checkpoint per dtype")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/export.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        measured = [m for vocab in args.vocab for m in measure(vocab, args.dtype, Path(work))]
    for m in measured:
        print(f"{m['preset']} vocab {m['vocab']} to {m['dtype']}: model {m['model_bytes'] / 2**20:.0f} MiB, "
              f"largest tensor {m['largest_tensor_bytes'] / 2**20:.0f} MiB, "
              f"export peak {m['peak_bytes'] / 2**20:.0f} MiB "
              f"({m['peak_per_largest_tensor']:.2f} x the largest tensor, {100 * m['peak_per_model']:.1f} % of "
              f"the model) above the interpreter's {m['interpreter_bytes'] / 2**20:.0f} MiB")
    result = {"measured": measured}
    interpreter = max(m["interpreter_bytes"] for m in measured)
    for dtype in args.dtype if len(args.vocab) >= 2 else ():
        points = [m for m in measured if m["dtype"] == dtype]
        slope, constant = numpy.polyfit([m["largest_tensor_bytes"] for m in points],
                                        [m["peak_bytes"] for m in points], 1)
        for target, vocab in TARGETS.items():
            largest, total = sizes(target, vocab)
            peak = slope * largest + constant
            result.setdefault(target, {})[dtype] = {
                "vocab": vocab, "largest_tensor_bytes": largest, "model_bytes": total,
                "peak_per_largest_tensor_byte": round(slope, 3), "constant_bytes": round(constant),
                "predicted_peak_bytes": round(peak), "predicted_process_bytes": round(peak + interpreter),
                "method": "extrapolated from the measured points (straight line), not a 70B run"}
            print(f"{target} to {dtype}: model {total / 2**30:.0f} GiB in fp32, largest tensor "
                  f"{largest / 2**30:.2f} GiB: export peak ~{peak / 2**30:.1f} GiB "
                  f"({slope:.2f} x largest + {constant / 2**20:.0f} MiB), "
                  f"~{(peak + interpreter) / 2**30:.1f} GiB with the interpreter (loading the model whole: "
                  f"{total / 1e9:.0f} GB)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
