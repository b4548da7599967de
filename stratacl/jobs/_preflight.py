"""The settings a job's ranks would each refuse, checked once before any rank starts.

``check(world, config)`` loads the topology (a file's every field: ub/_topology.py) and checks
that ``world`` ranks' shared address window fits (runtime/memory/_window.py). Both front doors call it
first: ``stratacl-launch`` prints the one ConfigError and exits 2, ``stratacl.spawn`` raises it.
Without it every rank would print the same traceback and the job would exit 1.
"""
from __future__ import annotations

from stratacl._config import Config
from stratacl.runtime.memory import check_window, slice_bytes_for
from stratacl.ub import load_topology


def check(world: int, config: Config) -> None:
    """Raise ConfigError naming the setting (and the topology field and value) to fix."""
    load_topology(config.topology)
    check_window(config.va_base, world, slice_bytes_for(config.hbm_size), config.hbm_size)
