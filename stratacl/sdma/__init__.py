"""The SDMA engine of a rank: cores build and post descriptors, the engine moves the bytes.

``_engine.py`` is the engine for real (descriptor queues, doorbell, engine thread), started by
the runtime for ``--path sdma``; ``_offload.py`` gives the modeled timelines of the same
descriptors, which the fabric model consults. The names exported here are the model's.
"""
from ._offload import COMPLETIONS as COMPLETIONS
from ._offload import PATHS as PATHS
from ._offload import SdmaRun as SdmaRun
from ._offload import descriptors as descriptors
from ._offload import run_sdma as run_sdma

__all__ = ["COMPLETIONS", "PATHS", "SdmaRun", "descriptors", "run_sdma"]
