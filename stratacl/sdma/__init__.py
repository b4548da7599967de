"""The SDMA engine of a rank: cores build and post descriptors, the engine moves the bytes.

``_engine.py`` is the engine for real (descriptor queues, doorbell, engine thread), started by
the runtime for ``--path sdma``; ``_model.py`` gives the modeled timelines of the same
descriptors, which the fabric model consults. The names exported here are the model's.
"""
from ._model import COMPLETIONS as COMPLETIONS
from ._model import PATHS as PATHS
from ._model import SdmaRun as SdmaRun
from ._model import descriptors as descriptors
from ._model import run_sdma as run_sdma

__all__ = ["COMPLETIONS", "PATHS", "SdmaRun", "descriptors", "run_sdma"]
