"""Report the job id this rank joined, and what its launcher told it, then finish.

    mpirun -n 2 python tests/scripts/job_names.py

``@@ {"kind": "names", "rank": r, "job_id": ..., "namespace": ...}``
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stratacl  # noqa: E402
from _report import emit  # noqa: E402

comm = stratacl.init()
from stratacl.runtime import _world  # noqa: E402

comm.barrier()
emit(kind="names", rank=comm.rank, job_id=_world._RUNTIME.job_id, namespace=os.environ.get("PMIX_NAMESPACE", ""))
stratacl.finalize()
