"""The SDMA engine of a rank: cores build and post descriptors, the engine moves the bytes.

``_engine.py`` is the engine for real (descriptor queues, doorbell, engine thread), started by
the runtime for ``--path sdma`` (``SdmaEngine``); ``_offload.py`` gives the modeled timelines of
the same descriptors, which the fabric model consults (the other names).
"""
from ._engine import SdmaEngine as SdmaEngine
from ._offload import COMPLETIONS as COMPLETIONS
from ._offload import PATHS as PATHS
from ._offload import SdmaRun as SdmaRun
from ._offload import descriptors as descriptors
from ._offload import paths_of as paths_of
from ._offload import run_sdma as run_sdma

__all__ = ["COMPLETIONS", "PATHS", "SdmaEngine", "SdmaRun", "descriptors", "paths_of", "run_sdma"]
