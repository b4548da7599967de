"""Rank 0 raises ValueError('boom') after init; the others never enter another collective.

With argv[1] == 'ignore-term' the others also ignore SIGTERM, so only SIGKILL ends them.
"""
import signal
import sys
import threading

if sys.argv[1:] == ["ignore-term"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # before init: set on every rank before rank 0 raises

import stratacl
from _report import emit

comm = stratacl.init()
emit(kind="started")
if comm.rank == 0:
    raise ValueError("boom")
threading.Event().wait()              # busy elsewhere: no collective will tell it rank 0 failed
