"""The goodput simulation: prod's models on 80 local Slurm nodes, node failures and slow nodes injected, in
compressed time.

    cluster.py   the simulation's own cluster (local_cluster/cluster.sh under LOCAL_CLUSTER_NAME), beside
                 the default one; every Slurm command through its slurm.conf
    faults.py    when nodes fail or turn slow (the plan's rates, seeded) and what that does to a node
    run.py       one run: shares, accounts and jobs from the plan, the calibration of the local overheads,
                 the run itself (failures injected, Slurm watched), what it leaves
    report.py    per model, measured vs predicted by cluster_config/goodput.py; the table

The trainer and clustermgtd are stand-ins (local_cluster/stand_ins/trainer.py, clustermgtd.py); the job
script, the recovery decision, Slurm and its accounting are the real ones. ``python -m
benchmarks.goodput_simulation`` runs it for 0 and 2 spares with stragglers evicted, and for 0 with them
unattended; docs/goodput.md explains how to read it.
"""
