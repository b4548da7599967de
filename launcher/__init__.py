"""``stratacl-launch``, the command line (_cli.py) over ``stratacl.jobs.Job``, which starts,
supervises and cleans up the ranks and the bootstrap daemon (stratacl/jobs/)."""
