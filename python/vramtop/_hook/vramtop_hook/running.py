"""The hook running in this process: None until `start` or the bootstrap made one, and
in a forked child until it made its own. Kept apart so that the OOM paths read it
without importing the entry points.

Stdlib only; nothing here raises into the job.
"""

hook = None
