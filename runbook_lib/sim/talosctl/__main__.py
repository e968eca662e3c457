"""Entry point of the simulated talosctl: the wrapper written by ``runbook sim up`` runs this module."""

import sys

from runbook_lib.sim.talosctl.main import main

sys.exit(main())
