"""One rank of benchmarks.hf_import: imports the checkpoint in each layout, writes <out>/rank<N>.json.

    torchrun --standalone --nproc-per-node=4 benchmarks/hf_import/worker.py '[folder, layouts, config, out]'
"""

import json
import sys
import time

from training.parallel import distributed
from training.dry_run import load_model_config
from training.models.hf_weights import load
from training.models.llama import hf_config
from training.models.presets import resolve
from training.train import build

folder, layouts, config, out = json.loads(sys.argv[1])
d = distributed.init(120)
arch = resolve(folder)
result = {}
for layout, overrides in layouts.items():
    cfg = load_model_config(config, [*overrides, f"model.preset={folder}"])
    model, _ = build(cfg, hf_config(arch, arch.vocab, 128), d, distributed.device_mesh(d, cfg.train))
    distributed.any_rank(False, d)  # start together
    start = time.perf_counter()
    source = load(model, folder, arch, folder)
    result[layout] = {"bytes": source["bytes_read_by_rank"], "seconds": time.perf_counter() - start}
    del model
with open(f"{out}/rank{d.rank}.json", "w") as f:
    json.dump(result, f)
distributed.shutdown()
