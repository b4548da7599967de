"""The host a benchmark ran on, for the header of its table and JSON."""
from __future__ import annotations

import os
import platform

import numpy as np


def host_facts() -> dict:
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        model = ""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"host": platform.node(), "cpu": model or platform.processor(), "cores": os.cpu_count(),
            "memory_gib": round(mem / 2**30, 1), "python": platform.python_version(), "numpy": np.__version__}
