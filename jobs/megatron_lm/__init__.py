"""Megatron-LM training of the models whose settings entry has ``megatron:`` (docs/megatron.md).

Not named ``megatron``: jobs/ is on the Python path, and a folder of that name would shadow
Megatron-LM's own package.

    preprocess.py            the model's token shards as Megatron's indexed datasets (.bin/.idx)
    args.py                  pretrain_gpt.py's arguments: the bundle's, plus the paths of this cluster
    status.py                where a run stands: its last checkpoint's iteration and how the job ended
    preprocess_megatron.sh   the CPU job running preprocess.py for a model
    pretrain.sh              the body of a Megatron model's training job (jobs/train_<model>.sh runs it)
"""
