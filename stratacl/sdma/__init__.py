"""The SDMA engine of a rank: cores build and post descriptors, the engine moves the bytes."""
from ._engine import COMPLETIONS as COMPLETIONS
from ._engine import PATHS as PATHS
from ._engine import SdmaRun as SdmaRun
from ._engine import descriptors as descriptors
from ._engine import run_sdma as run_sdma

__all__ = ["COMPLETIONS", "PATHS", "SdmaRun", "descriptors", "run_sdma"]
