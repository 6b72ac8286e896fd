"""The CDK stacks: network, storage and cluster, assembled by ``stacks.app``."""
