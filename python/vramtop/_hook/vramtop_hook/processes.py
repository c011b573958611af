"""The other processes on the GPU (NVML through ctypes, /proc): who holds its memory
and which framework each runs.

Stdlib only; nothing here raises into the job.
"""

import os


# Mapped-library fragments that name a framework; the same list as the viewer's
# (crates/vramtop-alloc/src/framework.rs, MARKERS), which a test keeps in step.
FRAMEWORK_MARKERS = (
    ("JAX/XLA", ("/jaxlib/", "/jax_plugins/", "xla_cuda_plugin", "xla_extension")),
    ("TensorFlow", ("libtensorflow_framework", "_pywrap_tensorflow")),
    ("PyTorch", ("libtorch_cuda", "libc10_cuda")),
    ("CuPy", ("/cupy/", "/cupy_backends/")),
    ("ONNX Runtime", ("libonnxruntime_providers_cuda",)),
    ("TensorRT", ("libnvinfer.",)),
    ("PaddlePaddle", ("/paddle/base/libpaddle", "libpaddle_inference")),
)


def frameworks_of(pid):
    """The frameworks whose libraries process `pid` has mapped; None when its maps cannot
    be read (another user's process, or gone)."""
    paths = set()
    try:
        with open("/proc/%d/maps" % pid, "r", errors="replace") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    paths.add(parts[5].strip())
    except OSError:
        return None
    return [name for name, marks in FRAMEWORK_MARKERS if any(m in p for p in paths for m in marks)]


def process_facts(pid):
    """User, command line and frameworks of `pid` from /proc; None for what cannot be read."""
    facts = {"user": None, "command": None, "frameworks": frameworks_of(pid)}
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            parts = [p.decode("utf-8", "replace") for p in f.read().split(b"\0") if p]
        facts["command"] = " ".join(parts)[:512] or None
    except OSError:
        pass
    try:
        with open("/proc/%d/status" % pid) as f:
            uid = next((int(l.split()[1]) for l in f if l.startswith("Uid:")), None)
        if uid is not None:
            try:
                import pwd

                facts["user"] = pwd.getpwuid(uid).pw_name
            except (ImportError, KeyError):
                facts["user"] = str(uid)
    except (OSError, ValueError, IndexError):
        pass
    return facts


NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1


def gpu_processes(uuid, pci_bus_id=None):
    """Every process NVML lists on one GPU (compute and graphics), each with its bytes and
    what /proc says of it: {"processes": [...], "own_pid_listed": bool}, or None where NVML
    cannot say (no libnvidia-ml, an unknown GPU). Through ctypes, stdlib only; called at an
    OOM, off the job's hot path. When this process is not among the pids listed, NVML speaks
    of another PID namespace (a container): the pids are not ours to read."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None

    class Info(ctypes.Structure):  # nvmlProcessInfo_t (v2 and v3 share it)
        _fields_ = [
            ("pid", ctypes.c_uint),
            ("usedGpuMemory", ctypes.c_ulonglong),
            ("gpuInstanceId", ctypes.c_uint),
            ("computeInstanceId", ctypes.c_uint),
        ]

    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        handle = ctypes.c_void_p()
        found = False
        if uuid:
            names = [uuid] if uuid.startswith(("GPU-", "MIG-")) else ["GPU-" + uuid, "MIG-" + uuid]
            for name in names:
                found = nvml.nvmlDeviceGetHandleByUUID(name.encode(), ctypes.byref(handle)) == 0
                if found:
                    break
        if not found and pci_bus_id and not (uuid or "").startswith("MIG-"):
            # By bus id a MIG instance would be its whole GPU, whose other instances'
            # processes share none of its memory: only for a UUID NVML did not know.
            found = nvml.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(handle)) == 0
        if not found:
            return None
        listed = {}
        answered = False
        for kind in ("Compute", "Graphics"):
            # v3 and v2 fill the same struct; drivers before R510 have only v2.
            call = None
            for version in ("_v3", "_v2"):
                try:
                    call = getattr(nvml, "nvmlDeviceGet%sRunningProcesses%s" % (kind, version))
                    break
                except AttributeError:
                    continue
            if call is None:
                continue
            size = 64
            while size <= 4096:
                infos = (Info * size)()
                count = ctypes.c_uint(size)
                rc = call(handle, ctypes.byref(count), infos)
                if rc == 7:  # NVML_ERROR_INSUFFICIENT_SIZE
                    size *= 4
                    continue
                if rc == 0:
                    answered = True
                    for info in infos[: count.value]:
                        used = info.usedGpuMemory
                        used = None if used == NVML_VALUE_NOT_AVAILABLE else int(used)
                        old = listed.get(info.pid)
                        listed[info.pid] = used if old is None else max(old, used or 0)
                break
    finally:
        nvml.nvmlShutdown()
    if not answered:
        return None  # NVML could not say: not "no processes"
    own = os.getpid()
    own_listed = own in listed
    processes = []
    for pid in sorted(listed):
        row = {"pid": pid, "bytes": listed[pid], "own": pid == own}
        if own_listed:
            row.update(process_facts(pid))
        processes.append(row)
    return {"processes": processes, "own_pid_listed": own_listed}


def who_holds_the_gpu(alloc, device):
    """At an OOM: the GPU's own total (not the per-process cap) and the processes on it.
    Never raises."""
    out = {"physical_total_bytes": None, "gpu_processes": None}
    try:
        props = alloc.torch.cuda.get_device_properties(device)
        out["physical_total_bytes"] = int(props.total_memory)
        bus = None
        if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            bus = "%08x:%02x:%02x.0" % (props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
        out["gpu_processes"] = gpu_processes(alloc.device_uuid(device), bus)
    except Exception:
        pass
    return out
