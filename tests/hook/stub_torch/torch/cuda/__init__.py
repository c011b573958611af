"""Stub torch.cuda: a tiny model of the caching allocator, driven by the test job."""

from .. import OutOfMemoryError  # noqa: F401
from . import memory  # noqa: F401
from .memory import _lazy_call, _lazy_init, is_initialized  # noqa: F401
from .memory import stub_alloc, stub_free, stub_oom  # noqa: F401

if "memory_stats" not in memory._LACKS:
    from .memory import memory_stats  # noqa: F401
if "memory_snapshot" not in memory._LACKS:
    from .memory import memory_snapshot  # noqa: F401


def get_allocator_backend():
    return memory.BACKEND


def init():
    _lazy_init()


def device_count():
    return 1


class _Properties:
    def __init__(self, device):
        self.name = "stub GPU (SIMULATED)"
        self.uuid = "5a1e0000-0000-0000-0000-00000000000%d" % device
        self.total_memory = memory.LIMIT_BYTES


def get_device_properties(device=None):
    return _Properties(device or 0)


def current_device():
    _lazy_init()
    return 0
