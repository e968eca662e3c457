from runbook_lib.cli import run

run()
