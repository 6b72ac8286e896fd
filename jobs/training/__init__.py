"""Training payload: a Llama-style causal LM over the packed token shards, under torchrun and Slurm.

The entry points, at this level (what users and the job scripts type):
  train         ``python -m training.train``: build the model, one training step, the loop
  config        the typed config: YAML file + ``section.key=value`` overrides; torch-free
  cluster       the bundle's models/cluster.json: its environment's models, GPU and price, generated from
                the settings so that the bundle never needs cluster_config; torch-free
  preflight     ``python -m training.preflight``: a model's data, tokenizer and settings, before sbatch
  status        ``python -m training.status``: every model's job, progress, losses, checkpoint, cost
  plot          ``python -m training.plot``: loss curve PNG from a run's metrics.jsonl
  export_hf     ``python -m training.export_hf``: a checkpoint to Hugging Face format
  dry_run       ``python -m training.dry_run``: one rank of the production job on the fake process group
  layout_check  one production layout shrunk (its widths, 2 layers) on the ranks at hand: init, loss,
                memory, MFU, compile vs eager, as numbers for the acceptance report

The packages, each a concern (its __init__ lists its modules):
  models/       the architecture as data, presets, the network, Hugging Face weights in
  parallel/     process groups, FSDP2/HSDP/DDP x tensor parallel; the traffic a layout costs
  checkpoints/  DCP checkpoints one writer at a time, their backup to S3, snapshots in node memory
  components/   optimizer, metrics, evaluation, determinism
  resilience/   stop signals, the watchdog, stragglers, replicas, the node to drain, requeue or stop
  sizing/       memory and step-time estimates for the plan

Layers, lowest first; a module imports only from its own layer or those below (tests/test_imports.py):
  1 torch-free foundations (the cluster settings and plan import them): config, cluster, models.architecture,
    models.presets, parallel.communication, sizing, resilience.straggler_rule, resilience.node_suspect
  2 the trainer's parts: models, parallel, checkpoints, components, resilience
  3 the trainer: train
  4 tools beside it: preflight, status, plot, export_hf, dry_run, layout_check

The local-cluster demo and its dataset live beside the local cluster (local_cluster/), not here:
this package ships to the real cluster.
"""
