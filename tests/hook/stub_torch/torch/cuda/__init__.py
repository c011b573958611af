"""Stub torch.cuda: a tiny model of the caching allocator, driven by the test job."""

from .. import OutOfMemoryError  # noqa: F401
from . import memory  # noqa: F401
from .memory import _lazy_call, _lazy_init, is_initialized  # noqa: F401
from .memory import stub_alloc, stub_free, stub_oom  # noqa: F401

if "memory_stats" not in memory._LACKS:
    from .memory import memory_stats  # noqa: F401
if "memory_snapshot" not in memory._LACKS:
    from .memory import memory_snapshot  # noqa: F401


def init():
    _lazy_init()


def device_count():
    return 1


def current_device():
    _lazy_init()
    return 0
