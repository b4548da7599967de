"""Another user fills /dev/shm while the job runs: rank 0 writes /dev/shm/FILLER (argv[1]) until
less than 1 MiB is left, then every rank allocates argv[2] MiB of HBM, whose pages no longer fit
(the job's HBM is in /dev/shm: it held all of it when the job started). The allocation must
raise OutOfMemory, uncaught here, so that the launcher reports it."""
import os
import sys

import numpy as np

import stratacl

filler, mib = sys.argv[1], int(sys.argv[2])
comm = stratacl.init()
if comm.rank == 0:
    st = os.statvfs("/dev/shm")
    with open(os.path.join("/dev/shm", filler), "wb") as f:
        f.write(bytes(st.f_bavail * st.f_frsize - (1 << 19)))
comm.barrier()
x = stratacl.empty((mib << 20,), np.uint8)
x[:] = 1
comm.barrier()
print("allocated on every rank", flush=True)
stratacl.finalize()
