"""See the package docstring of runbook_lib for the layer rules."""
