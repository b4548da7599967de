"""Rank WHO (argv[1]) calls sys.exit(CODE) (argv[2]); the others wait in a barrier."""
import sys

import stratacl

who, code = int(sys.argv[1]), int(sys.argv[2])
comm = stratacl.init()
if comm.rank == who:
    sys.exit(code)
comm.barrier()
