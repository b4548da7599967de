"""Rank WHO (argv[1]) ends with os._exit(0) after the first barrier, without finalize(): the
others wait for it in a second barrier and report what they saw."""
import os
import sys

import stratacl
from _report import emit, failure_record

who = int(sys.argv[1])
comm = stratacl.init()
comm.barrier()
if comm.rank == who:
    os._exit(0)
try:
    comm.barrier()
except stratacl.StrataError as e:
    emit(**failure_record(e))
    raise
