"""Deploy-true checks: the stacks deployed into an emulated AWS account (moto), ParallelCluster's own validators and update checks on the result."""
