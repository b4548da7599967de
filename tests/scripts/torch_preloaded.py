"""Says whether torch was imported before this script's own import of it ran: the launcher's
rank template imports torch for a script that imports it at its top (jobs/_template.py), and
the ranks still get one thread for numeric libraries (jobs/_supervisor.py RANK_THREAD_VARS)."""
import sys

BEFORE = "torch" in sys.modules

import torch  # noqa: E402

import stratacl  # noqa: E402

comm = stratacl.init()
print(f"@@ rank {comm.rank} torch before {BEFORE} threads {torch.get_num_threads()}", flush=True)
stratacl.finalize()
