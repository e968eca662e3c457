"""CPU the library spends per node on a big fleet (issue 16), measured as CPU time so a loaded machine does not
make it flaky: wall time would be.

Found with the real talosctl v1.12.0 against simnode (benchmarks/bench_real_talosctl.py, patch dry run): the
config-patch step parsed each node's machine config with PyYAML's pure-Python loader, 6.7 ms for the 20 KB worker
config ``talosctl gen config`` writes, so 1,000 nodes cost ~7 s of CPU before the first dry run, more than the
talosctl calls themselves; libyaml's loader parses the same config in 0.24 ms to equal documents.
"""

from __future__ import annotations

import gc
import time

import yaml

from runbook_lib.model.machineconfig import config_documents
from runbook_lib.sim.machineconfig import worker_config

NODES = 1000


def test_reading_a_thousand_nodes_configs_costs_well_under_a_second_of_cpu() -> None:
    text = yaml.safe_dump_all(worker_config("v1.12.0"))  # 2 KB: a tenth of a real one, no comments or certs
    # This thread's CPU only: process_time also counts every other thread of the pytest process (a simulator
    # or agent thread an earlier test left running in the full suite), which this loop does not spend.
    gc.collect()  # a collection of the whole suite's heap inside the loop is not the parser's cost either
    start = time.thread_time()
    for _ in range(NODES):
        docs = config_documents(text)
    cpu = time.thread_time() - start
    assert docs == list(yaml.safe_load_all(text))  # the same documents as PyYAML's own safe loader
    assert cpu < 0.8, f"{NODES} machine configs took {cpu:.2f} s of CPU to parse"
