"""Per-GPU memory of a training step and checkpoint size, computed from the shape alone (no PyTorch).

The planner (``python -m cluster_config plan``) uses this to say whether a model fits before a GPU
is rented. What it counts, per GPU, for the job as ``train.py`` runs it:

- parameters, gradients, optimizer state: fp32 master weights (4 bytes per parameter), fp32
  gradients (4) and AdamW's two moments (8). FSDP2 shards all three over every rank (HSDP over the
  ranks of one shard group; tensor parallel splits each block's matrices further); DDP keeps a
  full copy on each, plus its gradient buckets (4) and, under bf16 autocast, a bf16 copy of the
  weights (2).
- gathered (FSDP2 only): the unsharded bf16 weights of the layer being computed and of the one
  prefetched, the output unit's (final norm and output projection, kept gathered from forward to
  backward; the embedding is its own unit, gathered only while it runs), and one unsharded gradient in bf16 plus its fp32 copy
  for the reduce-scatter. Gradients are assumed reduce-scattered after every micro-batch, so no
  unsharded gradient outlives its layer's backward.
- activations: the tensors autograd saves for backward in one micro-batch. Per token and decoder
  layer, with ``a`` bytes per element of the compute dtype (2 for bf16)::

      8h + a (7h + 2 kv + 4 f)     h: hidden, kv: key/value width, f: MLP width

  (two RMSNorms each keep their fp32 input and normalized output; the q/k/v input, q, k, v, the
  attention output and the o_proj input; the MLP input and four f-wide tensors of the SwiGLU).
  Attention is the fused SDPA kernel (flash/memory-efficient on GPU, the flash kernel on CPU):
  it keeps a log-sum-exp per row, not the seq_len x seq_len matrix, so memory is linear in
  seq_len. With activation checkpointing a layer keeps only its input (a h per token). Then the final norm, the output
  projection's input, and the fp32 log-softmax (4 V per token, V the vocabulary).
  Tensor parallel (Megatron's layout with sequence parallelism) splits everything a layer keeps over
  its t ranks, except the two block inputs the column-parallel matrices read: those are all-gathered
  and kept whole (2 a h). With activation checkpointing a layer keeps its input's sequence shard
  (a h / t). The output projection is split by vocabulary: the log-softmax is 4 V / t; its gathered
  input is whole.
- transient: what lives briefly at the peak of backward: the bf16 logits and the fp32 gradients of
  the loss (a + 8 bytes x V per token), the activation gradients of one layer and, with activation
  checkpointing, the activations of the layer being rebuilt.

Checked against measurement: ``tests/training/test_sizing.py`` compares the activation term with the
bytes autograd really saves on CPU (within a few percent for two shapes); a test in
``tests/cluster_config`` checks the parameter count against the built model of every preset.
Not counted: the CUDA context, NCCL's buffers and the caching allocator's fragmentation, which the
planner covers with a headroom fraction of the GPU's memory (``plan.memory_headroom``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from training.models.architecture import Architecture

GIB = 2**30
ADAM_BYTES = 8  # two fp32 moments per parameter
MASTER_BYTES = 4  # fp32 weights (and fp32 gradients)


@dataclass(frozen=True)
class RunShape:
    preset: Architecture
    vocab_size: int
    seq_len: int
    micro_batch: int
    world_size: int
    parallelism: str = "fsdp"  # "fsdp" (FSDP2 over every data-parallel rank), "hsdp" or "ddp"
    activation_checkpointing: bool = False
    checkpoint_every: int = 1  # with activation checkpointing: every n-th layer (train.activation_checkpointing_every)
    tensor_parallel: int = 1
    hsdp_shard_size: int = 8  # hsdp: the data-parallel ranks one model copy is sharded over
    compute_bytes: int = 2  # bf16 on GPU; 4 when everything is fp32 (CPU)


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU at the peak of a training step, by category."""

    parameters: float
    gradients: float
    optimizer: float
    gathered: float
    activations: float
    transient: float

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def gib(self) -> dict[str, float]:
        return {**{f.name: getattr(self, f.name) / GIB for f in fields(self)}, "total": self.total / GIB}


def layer_activation_bytes_per_token(p: Architecture, a: int, tensor_parallel: int = 1) -> float:
    """Bytes one decoder layer saves for backward, per token (see the module docstring)."""
    norms = 8 * p.hidden  # the norms' fp32 input and output: sequence shards under tensor parallel
    block_inputs = a * 2 * p.hidden  # the attention and MLP inputs, gathered whole for the column-parallel matrices
    split = a * (5 * p.hidden + 2 * p.kv_size + 4 * p.ffn_size)  # between column- and row-parallel matrices
    return block_inputs + (norms + split) / tensor_parallel


def activation_bytes(run: RunShape) -> float:
    """What autograd keeps for backward over one micro-batch (all layers, the head and the loss)."""
    p, a = run.preset, run.compute_bytes
    tokens = run.micro_batch * run.seq_len
    per_layer = layer_activation_bytes_per_token(p, a, run.tensor_parallel)
    t = run.tensor_parallel
    # A checkpointed layer keeps its input (it is rebuilt in backward: transient); the others keep everything.
    checkpointed = checkpointed_layers(run)
    layers = checkpointed * a * p.hidden / t + (p.layers - checkpointed) * per_layer
    head = (4 * p.hidden + a * p.hidden) / t + a * p.hidden + 4 * run.vocab_size / t  # final norm, lm_head input, log-softmax
    return tokens * (layers + head)


def checkpointed_layers(run: RunShape) -> int:
    """Decoder layers whose activations are recomputed: 0, n, 2n... (distributed.parallelize)."""
    return -(-run.preset.layers // run.checkpoint_every) if run.activation_checkpointing else 0


def memory(run: RunShape) -> Memory:
    p, a = run.preset, run.compute_bytes
    total = p.parameters(run.vocab_size)
    tokens = run.micro_batch * run.seq_len
    t = run.tensor_parallel
    if run.parallelism in ("fsdp", "hsdp"):
        # One model copy is t tensor-parallel ranks x its data-parallel shard ranks.
        shard = total / (run.world_size if run.parallelism == "fsdp" else run.hsdp_shard_size * t)
        # The output unit (final norm and output projection, split by vocabulary) stays gathered from
        # forward to backward; the embedding's unit is gathered only while it runs.
        output = run.vocab_size * p.hidden / t + p.hidden
        layer = p.layer_parameters / t  # a block gathered by FSDP is still split by tensor parallel
        grad_copy = a + (MASTER_BYTES if a != MASTER_BYTES else 0)  # grad in compute dtype (+ fp32 copy to reduce)
        gathered = a * (2 * layer + output) + grad_copy * max(layer, output)
        params, grads, optim = MASTER_BYTES * shard, MASTER_BYTES * shard, ADAM_BYTES * shard
    elif run.parallelism == "ddp":
        gathered = MASTER_BYTES * total + (a * total if a != MASTER_BYTES else 0)  # buckets, autocast copies
        params, grads, optim = MASTER_BYTES * total, MASTER_BYTES * total, ADAM_BYTES * total
    else:
        raise ValueError(f"parallelism {run.parallelism!r}: expected fsdp, hsdp or ddp")
    # The logits and the loss's fp32 gradients, one layer's activation gradients and, with activation
    # checkpointing, the layer being rebuilt.
    layers = 2 if checkpointed_layers(run) else 1
    transient = tokens * ((a + 2 * 4) * run.vocab_size / t + layers * layer_activation_bytes_per_token(p, a, t))
    return Memory(params, grads, optim, gathered, activation_bytes(run), transient)


def checkpoint_bytes(p: Architecture, vocab_size: int) -> int:
    """One DCP checkpoint: fp32 weights and AdamW's two fp32 moments (step counters are negligible)."""
    return (MASTER_BYTES + ADAM_BYTES) * p.parameters(vocab_size)
