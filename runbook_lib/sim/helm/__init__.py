"""The simulated ``helm`` (v3 CLI): ``python -m runbook_lib.sim.helm`` behaves as ``helm`` against the simulated API.

It reaches the API over HTTP with the kubeconfig, like real helm, and keeps releases where real helm keeps them:
Secrets ``sh.helm.release.v1.<name>.v<N>`` (type ``helm.sh/release.v1``) in the release namespace.  Repositories
are recorded in ``$HELM_REPOSITORY_CONFIG``, else ``<state>/helm/repositories.yaml`` when ``RUNBOOK_SIM_STATE`` is
set (the wrapper in the state's ``bin/`` sets it), else ``~/.config/helm/repositories.yaml``.
"""
