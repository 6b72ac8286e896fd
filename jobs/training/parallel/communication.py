"""Collective traffic of a training step, counted from the shape and the layout alone (no PyTorch).

The least communication the job's layout needs, for the planner (``cluster_config``, torch-free) to
turn into exposed time and for ``benchmarks/communication`` to hold the measured collectives against.
Every collective is counted by the mesh dimension it runs on and its kind:

- ``dp_shard``: FSDP2's group (every data-parallel rank under FSDP, one shard group of
  ``hsdp_shard_size`` ranks under HSDP): ``all_gather`` of parameters, ``reduce_scatter`` of gradients;
- ``dp_replicate``: HSDP's replicas (and DDP's ranks): ``all_reduce`` of gradients;
- ``tp``: the tensor-parallel ranks of one model copy.

Sizes are of the whole tensor a collective makes or consumes (an all-gather's output, a
reduce-scatter's input, an all-reduce's tensor). The bytes each GPU sends over its links with ring
algorithms (what NCCL's "bus bandwidth" divides) follow from the group's size n::

    all_gather, reduce_scatter, all_to_all:  (n - 1) / n x size
    all_reduce:                          2 x (n - 1) / n x size
    broadcast, reduce:                                   size

``layer_traffic`` is one decoder layer in one micro-batch, ``step_traffic`` the whole model in one
optimizer step; both return a ``Traffic`` (count, size and bytes per GPU by dimension and kind).
The measured counterpart (``benchmarks/communication``) builds the same ``Traffic`` from the
collectives PyTorch issues in the dry run's fake process group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from training.models.architecture import Architecture

DIMS = ("tp", "dp_shard", "dp_replicate")
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "reduce", "gather", "scatter")
REDUCE_BYTES = 4  # gradients are reduced in fp32 (FSDP's reduce_dtype, DDP's fp32 gradients)
LOSS_PARALLEL_REDUCTIONS = 3  # cross-entropy on vocabulary shards: row max, sum of exponentials, the label's logit


def ring_bytes(kind: str, size: float, group: int) -> float:
    """Bytes each GPU sends in one ring collective of ``size`` bytes over ``group`` ranks."""
    if group <= 1:
        return 0.0
    if kind in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (group - 1) / group * size
    if kind == "all_reduce":
        return 2 * (group - 1) / group * size
    if kind in ("broadcast", "reduce"):
        return float(size)
    raise ValueError(f"collective kind {kind!r}: expected one of {', '.join(KINDS)}")


@dataclass(frozen=True)
class Flow:
    """Collectives of one kind on one mesh dimension: how many, their total size, bytes sent per GPU."""

    count: float = 0
    size: float = 0
    bytes: float = 0

    def __add__(self, other: Flow) -> Flow:
        return Flow(self.count + other.count, self.size + other.size, self.bytes + other.bytes)

    def __mul__(self, k: float) -> Flow:
        return Flow(self.count * k, self.size * k, self.bytes * k)


@dataclass(frozen=True)
class Traffic:
    """Collectives by (mesh dimension, kind). Add them, scale them (``traffic * accumulation``)."""

    flows: dict[tuple[str, str], Flow] = field(default_factory=dict)

    @classmethod
    def of(cls, dim: str, kind: str, size: float, group: int, count: float = 1) -> Traffic:
        """``count`` collectives of ``size`` bytes each over ``group`` ranks."""
        if count == 0:
            return cls()
        return cls({(dim, kind): Flow(count, count * size, count * ring_bytes(kind, size, group))})

    def __add__(self, other: Traffic) -> Traffic:
        flows = dict(self.flows)
        for key, flow in other.flows.items():
            flows[key] = flows.get(key, Flow()) + flow
        return Traffic(flows)

    def __sub__(self, other: Traffic) -> Traffic:
        return self + other * -1

    def __mul__(self, k: float) -> Traffic:
        return Traffic({key: flow * k for key, flow in self.flows.items()})

    __rmul__ = __mul__

    def _select(self, dims, kind: str | None) -> Flow:
        dims = (dims,) if isinstance(dims, str) else dims
        total = Flow()
        for (d, k), flow in self.flows.items():
            if (dims is None or d in dims) and (kind is None or k == kind):
                total += flow
        return total

    def count(self, dims: str | tuple[str, ...] | None = None, kind: str | None = None) -> float:
        """Collectives on ``dims`` (one name or several; None: all) of ``kind`` (None: all)."""
        return self._select(dims, kind).count

    def bytes(self, dims: str | tuple[str, ...] | None = None, kind: str | None = None) -> float:
        """Bytes each GPU sends in them (ring algorithms)."""
        return self._select(dims, kind).bytes

    def counts(self) -> dict[tuple[str, str], float]:
        """Non-zero counts by (dimension, kind)."""
        return {key: flow.count for key, flow in sorted(self.flows.items()) if round(flow.count, 9)}

    def as_dict(self) -> dict:
        """{"<dim> <kind>": {"count", "size", "bytes"}}, for JSON."""
        return {f"{d} {k}": {"count": round(f.count, 6), "size": round(f.size), "bytes": round(f.bytes)}
                for (d, k), f in sorted(self.flows.items()) if round(f.count, 9)}


@dataclass(frozen=True)
class _Layout:
    tp: int
    shard: int  # ranks FSDP shards over (dp_shard)
    replicas: int  # copies of each shard (dp_replicate): HSDP's groups, DDP's ranks
    parallelism: str
    grad_reduce: str
    compute_bytes: int
    reduce_bytes: int


def _layout(parallelism: str, tp: int, dp: int, hsdp_shard_size: int, grad_reduce: str,
            compute_bytes: int, reduce_bytes: int) -> _Layout:
    if parallelism == "fsdp":
        shard, replicas = dp, 1
    elif parallelism == "hsdp":
        if dp % hsdp_shard_size:
            raise ValueError(f"hsdp_shard_size {hsdp_shard_size} does not divide the {dp} data-parallel ranks")
        shard, replicas = hsdp_shard_size, dp // hsdp_shard_size
    elif parallelism == "ddp":
        shard, replicas = 1, dp
    else:
        raise ValueError(f"parallelism {parallelism!r}: expected fsdp, hsdp or ddp")
    if grad_reduce not in ("every_micro_batch", "last_micro_batch"):
        raise ValueError(f"grad_reduce {grad_reduce!r}: expected every_micro_batch or last_micro_batch")
    return _Layout(tp, shard, replicas, parallelism, grad_reduce, compute_bytes, reduce_bytes)


def _unit(params: float, lay: _Layout, *, gathers: int, last_micro_batch: bool) -> Traffic:
    """Data-parallel traffic of one FSDP unit holding ``params`` parameters per tensor-parallel rank."""
    if lay.parallelism == "ddp":  # whole fp32 gradients all-reduced once per step (DDP's buckets)
        return Traffic.of("dp_replicate", "all_reduce", params * lay.reduce_bytes, lay.replicas, int(last_micro_batch))
    traffic = Traffic.of("dp_shard", "all_gather", params * lay.compute_bytes, lay.shard, gathers)
    if last_micro_batch or lay.grad_reduce == "every_micro_batch":
        traffic += Traffic.of("dp_shard", "reduce_scatter", params * lay.reduce_bytes, lay.shard)
    if lay.replicas > 1 and last_micro_batch:
        traffic += Traffic.of("dp_replicate", "all_reduce", params / lay.shard * lay.reduce_bytes, lay.replicas)
    return traffic


def layer_traffic(preset: Architecture, *, micro_batch: int, seq_len: int, tp: int = 1, dp: int, parallelism: str = "fsdp",
                  hsdp_shard_size: int = 8, activation_checkpointing: bool = False,
                  grad_reduce: str = "every_micro_batch", last_micro_batch: bool = False, compute_bytes: int = 2,
                  reduce_bytes: int = REDUCE_BYTES) -> Traffic:
    """The least collective traffic of one decoder layer in one micro-batch.

    ``dp`` is the data-parallel ranks (world size / ``tp``); ``last_micro_batch`` adds what only the
    step's last micro-batch does (HSDP's all-reduce across replicas; with ``grad_reduce`` =
    ``last_micro_batch`` the reduce-scatter). Notation: h hidden, V vocabulary, P the layer's
    parameters (``preset.layer_parameters``: matrices M plus the two norm weights, 2h), t = ``tp``,
    c = ``compute_bytes`` (bf16: 2), r = ``reduce_bytes`` (fp32: 4), b x s the micro-batch's tokens.

    Data parallel (FSDP2/HSDP, the layer is one FSDP unit of M / t + 2h parameters per
    tensor-parallel rank: the matrices are split by tensor parallelism, the norm weights are not):

    - ``dp_shard all_gather`` x 2 of (M / t + 2h) c bytes: the bf16 layer gathered for forward, and
      again for backward (it is resharded after forward);
    - ``dp_shard reduce_scatter`` x 1 of (M / t + 2h) r bytes: its gradients, every micro-batch;
    - HSDP, last micro-batch only: ``dp_replicate all_reduce`` x 1 of (M / t + 2h) r / shard bytes, the
      fp32 gradient shard summed across the replicas (nodes) once per step;
    - DDP: ``dp_replicate all_reduce`` of P r bytes on the last micro-batch (no gathers).

    Tensor parallel, Megatron's layout with sequence parallelism (Korthikanti et al. 2022): between
    blocks the residual stream is split along the sequence. Each of the two blocks (attention, MLP)
    all-gathers its normalized input (b s h c bytes) before its column-parallel matrices and
    reduce-scatters the row-parallel output (b s h c) back to sequence shards:

    - forward: ``tp all_gather`` x 2 and ``tp reduce_scatter`` x 2, each of b s h c bytes;
    - backward, the mirror: the gather's gradient is reduce-scattered, the reduce-scatter's
      gathered: ``all_gather`` x 2, ``reduce_scatter`` x 2;
    - activation checkpointing rebuilds the layer's forward in backward, up to the last tensor
      backward needs (PyTorch stops the recomputation there): both gathers and the attention's
      reduce-scatter again (the MLP's output feeds only the residual sum, which keeps nothing):
      ``all_gather`` x 2, ``reduce_scatter`` x 1;
    - the norm weights act on sequence shards, so their gradients are partial sums:
      ``tp all_reduce`` x 2 of h c bytes (tiny).

    So with activation checkpointing 6 all-gathers and 5 reduce-scatters of b s h c bytes per layer
    and micro-batch, each moving (t - 1) / t of it per GPU; 4 and 4 without.
    """
    lay = _layout(parallelism, tp, dp, hsdp_shard_size, grad_reduce, compute_bytes, reduce_bytes)
    h = preset.hidden
    matrices = preset.layer_parameters - 2 * h
    if parallelism == "ddp":
        traffic = _unit(preset.layer_parameters, lay, gathers=0, last_micro_batch=last_micro_batch)
    else:
        traffic = _unit(matrices / tp + 2 * h, lay, gathers=2, last_micro_batch=last_micro_batch)
    if tp > 1:
        activation = micro_batch * seq_len * h * compute_bytes
        gathers, scatters = (6, 5) if activation_checkpointing else (4, 4)
        traffic += Traffic.of("tp", "all_gather", activation, tp, gathers)
        traffic += Traffic.of("tp", "reduce_scatter", activation, tp, scatters)
        traffic += Traffic.of("tp", "all_reduce", h * compute_bytes, tp, 2)
    return traffic


def outer_traffic(preset: Architecture, *, vocab_size: int, micro_batch: int, seq_len: int, tp: int = 1, dp: int,
                  parallelism: str = "fsdp", hsdp_shard_size: int = 8, grad_reduce: str = "every_micro_batch",
                  last_micro_batch: bool = False, compute_bytes: int = 2, reduce_bytes: int = REDUCE_BYTES) -> Traffic:
    """The least collective traffic of everything but the decoder layers in one micro-batch.

    FSDP units as torchtitan makes them: the embedding (V h / t parameters per tensor-parallel
    rank), gathered for forward and again for backward like a layer; the final norm with the output
    projection (h + V h / t), gathered once: backward needs them right after forward, so they are
    not resharded in between (FSDP2 keeps its root unit the same way). Each reduce-scatters its
    gradients every micro-batch and, under HSDP, all-reduces the shard across replicas on the last.

    Tensor parallel: the embedding is split by vocabulary, its partial output reduce-scattered to
    sequence shards (forward) and the gradient all-gathered (backward); the output projection
    all-gathers the final norm's output (forward) and reduce-scatters its gradient (backward), each
    b s h c bytes; loss parallelism computes the cross-entropy on vocabulary shards, never gathering
    logits, with 3 all-reduces of b s fp32 values (row max, sum of exponentials, the label's logit),
    and the final norm's weight gradient is all-reduced (h c bytes).
    """
    lay = _layout(parallelism, tp, dp, hsdp_shard_size, grad_reduce, compute_bytes, reduce_bytes)
    h, table = preset.hidden, vocab_size * preset.hidden
    if parallelism == "ddp":
        traffic = _unit(2 * table + h, lay, gathers=0, last_micro_batch=last_micro_batch)
    else:
        traffic = (_unit(table / tp, lay, gathers=2, last_micro_batch=last_micro_batch)
                   + _unit(table / tp + h, lay, gathers=1, last_micro_batch=last_micro_batch))
    if tp > 1:
        activation = micro_batch * seq_len * h * compute_bytes
        traffic += Traffic.of("tp", "all_gather", activation, tp, 2)
        traffic += Traffic.of("tp", "reduce_scatter", activation, tp, 2)
        traffic += Traffic.of("tp", "all_reduce", micro_batch * seq_len * 4, tp, LOSS_PARALLEL_REDUCTIONS)
        traffic += Traffic.of("tp", "all_reduce", h * compute_bytes, tp)
    return traffic


def recomputed_layers(layers: int, activation_checkpointing: bool, every: int = 1) -> int:
    """Decoder layers whose forward backward recomputes: layers 0, every, 2 x every, ... when checkpointing."""
    return -(-layers // every) if activation_checkpointing else 0


def step_traffic(preset: Architecture, *, vocab_size: int, micro_batch: int, seq_len: int, accumulation: int, tp: int = 1,
                 dp: int, parallelism: str = "fsdp", hsdp_shard_size: int = 8, activation_checkpointing: bool = False,
                 activation_checkpointing_every: int = 1, grad_reduce: str = "every_micro_batch",
                 compute_bytes: int = 2, reduce_bytes: int = REDUCE_BYTES) -> Traffic:
    """The least collective traffic of one optimizer step of the whole model, per GPU.

    ``accumulation`` micro-batches, each ``preset.layers`` x ``layer_traffic`` + ``outer_traffic``
    (with ``activation_checkpointing_every`` = n only every n-th layer is checkpointed, the others
    keep their activations and are not recomputed); what is reduced only once per step (HSDP's
    all-reduce across replicas, deferred reduce-scatters) counted on the last. Not counted: the
    gradient-norm all-reduces of a few scalars per step. Per GPU time is ``bytes(dim)`` over the bus
    bandwidth of that dimension's links (``tp`` and HSDP's ``dp_shard`` within a node, the rest
    across nodes).
    """
    common = dict(micro_batch=micro_batch, seq_len=seq_len, tp=tp, dp=dp, parallelism=parallelism,
                  hsdp_shard_size=hsdp_shard_size, grad_reduce=grad_reduce, compute_bytes=compute_bytes,
                  reduce_bytes=reduce_bytes)
    recomputed = recomputed_layers(preset.layers, activation_checkpointing, activation_checkpointing_every)

    def micro(last: bool) -> Traffic:
        layers = (layer_traffic(preset, activation_checkpointing=True, last_micro_batch=last, **common) * recomputed
                  + layer_traffic(preset, last_micro_batch=last, **common) * (preset.layers - recomputed))
        return layers + outer_traffic(preset, vocab_size=vocab_size, last_micro_batch=last, **common)

    return micro(False) * (accumulation - 1) + micro(True)
