"""Benchmarks: speed and memory targets, measured against the simulated cluster (``make bench``)."""
