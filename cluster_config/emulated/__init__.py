"""Deploy-true checks: the stacks deployed into an emulated AWS account (moto), then ParallelCluster's
own validators and update checks on the config rendered with what that deploy returned.

  stubs.py          every stand-in and template edit, each with its reason (the one place)
  acknowledged.py   ParallelCluster warnings accepted, each with its reason (the one place)
  moto_server.py    the emulated account: moto's server on 127.0.0.1 with stubs.MOTO_GAPS filled
  account.py        deploy one environment into it and render the config with the returned ids
  pcluster_child.py runs in .venv-pcluster: validators (create --dryrun) and ConfigPatch (update)
  check.py          one environment end to end -> Report; `python -m cluster_config validate`
"""


class PclusterNotInstalled(RuntimeError):
    """ParallelCluster's own venv (.venv-pcluster) is missing."""
