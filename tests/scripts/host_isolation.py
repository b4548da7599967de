"""What each rank of a job over emulated hosts sees of the others, through the kernel.

Rank 0 makes a shared-memory object in its /dev/shm; every rank tries to open it by name. Every
rank tries to reach the job's store over its own loopback, and at the store's address. Every
rank reports its /dev/shm's device, its network interfaces and its address on the route to the
store. Nothing is judged here: the test compares the hosts.
"""
import errno
import os
import socket

import _posixshmem
import numpy as np

import stratacl
from _report import emit

comm = stratacl.init()
pids = stratacl.empty((comm.size,), np.int64)
me = stratacl.empty((1,), np.int64)
me[0] = os.getpid()
comm.all_gather(pids, me)
name = f"/stratacl-{os.environ.get('STRATACL_TEST_JOB_TAG', 'x')}probe-{int(pids[0])}"
if comm.rank == 0:
    os.close(_posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
comm.barrier()


def attempt(fn) -> str:
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


opened = attempt(lambda: os.close(_posixshmem.shm_open(name, os.O_RDONLY, 0)))
comm.barrier()
if comm.rank == 0:
    _posixshmem.shm_unlink(name)
host, port = os.environ["STRATACL_STORE"].rsplit(":", 1)


def connect(address: str) -> None:
    with socket.create_connection((address, int(port)), timeout=5):
        pass


with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.connect((host, 9))                        # a route only: nothing is sent
    address = s.getsockname()[0]
emit(kind="isolation", opened=opened, loopback_store=attempt(lambda: connect("127.0.0.1")),
     store=attempt(lambda: connect(host)), store_host=host, shm_dev=os.stat("/dev/shm").st_dev,
     interfaces=sorted(n for _, n in socket.if_nameindex()), address=address, hostname=socket.gethostname())
comm.barrier()
stratacl.finalize()
