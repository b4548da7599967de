"""What runs inside a rank: bootstrap client, HBM segments, VA window, allocators, mailbox, communicator."""

from ._call import Pipeline as Pipeline
from ._call import pipeline as pipeline
from ._onesided import COMPARISONS as COMPARISONS
from ._onesided import SIGNAL_OPS as SIGNAL_OPS
from ._onesided import SymmetricHeap as SymmetricHeap
from ._onesided import address_of as address_of

__all__ = ["COMPARISONS", "Pipeline", "SIGNAL_OPS", "SymmetricHeap", "address_of", "pipeline"]
