import sys

from runbook_lib.sim.helm.cli import main

sys.exit(main(sys.argv[1:]))
