"""Run at the start of every Python process whose PYTHONPATH holds this directory (bench_restart_phases.py
puts it there): timestamps at method boundaries of the restart (benchmarks/restart_probe.py), and the kill
plan of tests/killpoints when one is named (only one sitecustomize runs per process)."""

import os

if os.environ.get("CEC_BENCH_PROBE"):
    from restart_probe import install

    install(os.environ["CEC_BENCH_PROBE"])
if os.environ.get("CEC_TEST_KILL"):
    from tests.killpoints import install as install_kills

    install_kills(os.environ["CEC_TEST_KILL"])
