"""talos-gpu-runbooks: the library behind the runbook notebooks.

Layers (enforced by import-linter, see pyproject.toml): ``model`` (pure) -> ``clients`` (all I/O)
-> ``steps`` (plan/apply/verify, return results) -> ``notebook`` (widgets, rendering, records) -> ``cli``.
``sim`` is the simulated cluster; the library reaches it only through binaries and URLs.
"""

__version__ = "0.1.0"
