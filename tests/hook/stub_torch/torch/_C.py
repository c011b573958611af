"""The stub's C extension: only the OOM observer registration."""

import os

_LACKS = set(filter(None, os.environ.get("STUB_TORCH_LACKS", "").split(",")))

if "oom_observer" not in _LACKS:

    def _cuda_attach_out_of_memory_observer(observer):
        from . import cuda

        cuda._lazy_init()  # as torch/csrc/cuda/Module.cpp does
        cuda.memory._refused_by_async("attachOutOfMemoryObserver")
        cuda.memory._observers.append(observer)
