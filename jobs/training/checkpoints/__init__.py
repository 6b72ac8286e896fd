"""Checkpoints: writing and trusting them, who may write them, their copy in S3, and snapshots in node memory.

  checkpointer  asynchronous DCP checkpoints, the ``latest`` pointer written last, fallback past a bad step,
                never a silent restart from step 0
  lease         one writer per model's checkpoint folder (a lease another job cannot take over)
  backup        ``python -m training.checkpoints.backup``: the final checkpoint copied to S3 and verified
  snapshot      every rank's shard in its node's memory and a buddy node's, what a relaunch in the job resumes from
"""
