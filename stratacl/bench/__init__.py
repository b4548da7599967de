"""``stratacl-bench``: nccl-tests-style sweeps of every operator, with peers and the host limit."""
