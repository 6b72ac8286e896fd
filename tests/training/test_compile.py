"""torch.compile of each decoder layer (train.compile) on CPU: same losses as eager, exact resume."""

from __future__ import annotations

import pytest
from conftest import Run
from test_layouts import assert_close, losses, resume_from

STEPS = ("train.steps=6", "checkpoint.every=3", "log.interval=1", "optim.warmup_steps=2", "data.num_workers=0")


@pytest.mark.slow
@pytest.mark.drill
def test_compiled_layers_match_eager_and_resume_exactly(tiny_data, tmp_path):
    eager = Run(tmp_path / "eager")
    assert eager.run(tiny_data, *STEPS, "train.compile=false", nproc=1) == 0, eager.output[-4000:]
    compiled = Run(tmp_path / "compiled")
    assert compiled.run(tiny_data, *STEPS, "train.compile=true", nproc=1) == 0, compiled.output[-4000:]
    # Inductor fuses the norms and the SwiGLU: fp32 sums in another order, nothing else.
    assert_close(losses(compiled), losses(eager))

    resumed = resume_from(tmp_path, "resumed", compiled, 3)
    assert resumed.run(tiny_data, *STEPS, "train.compile=true", nproc=1) == 0, resumed.output[-4000:]
    assert "resumed from" in resumed.output
    assert resumed.losses() == {s: v for s, v in compiled.losses().items() if s > 3}  # bit for bit
