"""The local two-node Slurm cluster: cluster.sh brings it up and down, client.py drives it from Python."""
