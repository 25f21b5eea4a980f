"""Run at the start of every Python process whose PYTHONPATH holds this directory (tests.helpers.child_env
puts it there with a kill plan): installs the plan's wrappers (tests/killpoints)."""

import os

if os.environ.get("CEC_TEST_KILL"):
    from tests.killpoints import install

    install(os.environ["CEC_TEST_KILL"])
