"""What runs inside a rank: bootstrap client, HBM segments, VA window, allocators, mailbox, communicator."""

from ._call import Pipeline as Pipeline
from ._call import pipeline as pipeline

__all__ = ["Pipeline", "pipeline"]
