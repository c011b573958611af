"""Stub torch._inductor: what PyTorch imports to read recorded Python stacks. The hook
imports it on the job's thread before stacks are recorded; which thread did is kept here."""

import threading

IMPORTED_BY = threading.current_thread().name
