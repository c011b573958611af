"""What the memory is for, found without scanning the heap (`RoleWatch`: optimizers,
models, their parameters, gradients and state; models the job's own frames hold), and the
allocated-bytes series.

Stdlib only; nothing here raises into the job.
"""

import functools
import sys
import threading
import time
import weakref

from .settings import SERIES_MAX, SERIES_PERIOD_S

CO_OPTIMIZED = 0x0001  # a function's frame (inspect.CO_OPTIMIZED): its locals are fast locals


class RoleWatch:
    """What the job's memory is for: parameters and buffers, gradients, optimizer state.

    Found without scanning the heap. Optimizers: a global optimizer step pre-hook (one set
    add a step). Models: global module forward hooks that note each root module (one whose
    forward runs inside no other) and remove themselves once a root comes round again (the
    job's second step: every model of a step is known) or after MODELS_WATCH_S. Counted on
    the tensors' own storages: each storage once (tied weights, DDP's gradient buckets),
    only those on the device asked about. What no role claims is left to the viewer as
    "other" (activations, temporaries, inputs).

    Where they are read: a gradient is written by the autograd engine's own thread, without
    the GIL, so reading `.grad` from the hook's thread raced it and crashed a GPT-2 job
    (a segfault, on the H100). So for a job with an optimizer the roles are read on the
    job's thread, just after an optimizer step (gradients alive, the step done), once each
    time a viewer's state asked for them (`wanted`), and at an OOM on the thread that hit
    it; a state carries the last reading, with its time. A job with models and no
    optimizer (inference) has no gradients to race: its parameters are read at the state."""

    MODELS_WATCH_S = 60.0
    # What `held_in_frames` looks through: the job's thread's innermost frames, and the first
    # names of each (a script's globals are its bottom frame's).
    FRAMES_MAX = 64
    NAMES_MAX = 512

    def __init__(self, torch, totals=None):
        self.torch = torch
        # device -> (allocated, reserved) now: read with the roles, so that what no role
        # claims is told at the same moment.
        self.totals = totals
        self.models = weakref.WeakSet()
        self.optimizers = weakref.WeakSet()
        self.handles = []
        self.local = threading.local()
        self.watch_until = None
        self.came_round = False  # a root module's forward ran again: a pass has ended
        self.wanted = False  # a state asked; the next step reads them
        self.at_step = None  # {device: figures} read just after the last step that read
        self.at_step_time = None
        self.passes = None  # a PassMarks, told each new root module (`follow`)
        self.idle = False  # done watching, its global hooks left in (`stop_watching`)
        self.averaged = weakref.WeakSet()  # AveragedModels made (`watch_averaged`)

    def watch_models(self):
        module = sys.modules.get("torch.nn.modules.module")
        pre = getattr(module, "register_module_forward_pre_hook", None)
        post = getattr(module, "register_module_forward_hook", None)
        if pre is None or post is None:
            return False
        watch = self
        # Inside a torch.compile'd forward Dynamo traces global hooks; what ours call
        # (time.monotonic, a thread-local) it cannot, and it would warn and break the graph.
        # Traced, they do nothing: the compiled module's own call, outside, is the root.
        compiling = getattr(getattr(self.torch, "compiler", None), "is_compiling", None) or (lambda: False)

        def _vramtop_root_pre(module, args):
            if compiling() or watch.idle:
                return None
            try:
                now = time.monotonic()
                if watch.watch_until is not None and now > watch.watch_until:
                    watch.stop_watching()  # whatever the depth: a raising forward leaves it up
                    return None
                depth = getattr(watch.local, "depth", 0)
                watch.local.depth = depth + 1
                if depth:
                    return None
                if watch.watch_until is None:
                    watch.watch_until = now + watch.MODELS_WATCH_S
                if module in watch.models:
                    watch.came_round = True
                    watch.stop_watching()
                else:
                    if watch.passes is not None:
                        watch.passes.follow(module)
                    watch.models.add(module)
            except Exception:
                pass
            return None

        def _vramtop_root_post(module, args, output):
            if compiling() or watch.idle:
                return None
            try:
                watch.local.depth = max(getattr(watch.local, "depth", 1) - 1, 0)
            except Exception:
                pass
            return None

        try:
            first = pre(_vramtop_root_pre)
            try:
                # Run after a forward that raised too (torch 2.2+), or the depth stays up.
                second = post(_vramtop_root_post, always_call=True)
            except TypeError:
                second = post(_vramtop_root_post)
            self.handles = [first, second]
        except Exception:
            return False
        self.quiet_compile_warning()
        note_in_place_compiles(getattr(module, "Module", None))
        return True

    # torch.compile(module) warns at every call while any global module hook exists
    # (OptimizedModule.__call__, PyTorch 2.11): with ours in place a compiled job would print
    # it, and under -W error die of it. Ours alone cause it, so it is ignored while they
    # live, by a filter put first (before -W error's) and taken out with them.
    COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"

    def quiet_compile_warning(self):
        try:
            import warnings

            warnings.filterwarnings("ignore", message=self.COMPILE_WARNING, category=UserWarning)
            self.warning_filter = warnings.filters[0]
        except Exception:
            self.warning_filter = None

    def stop_watching(self):
        """The global hooks go, and the compile warning's filter with them; where Dynamo has
        compiled a graph and a noted model is compiled they stay, idle (`idle`): it traced
        them in, and guards on how many global hooks there are, so taking them out
        recompiled a GPT-2's forward under torch.compile(model) at its second step (H200,
        PyTorch 2.11)."""
        if self.handles and dynamo_compiled() and self.compiled_model():
            self.idle = True
            self.local.depth = 0  # no longer followed: the idle post-hook counts nothing
            return
        handles, self.handles = self.handles, []
        remove_all(handles)
        entry, self.warning_filter = getattr(self, "warning_filter", None), None
        if entry is not None:
            try:
                import warnings

                warnings.filters.remove(entry)
                warnings._filters_mutated()
            except Exception:
                pass

    def compiled_model(self):
        """Whether a model the watch noted is compiled (torch.compile's OptimizedModule, or
        Module.compile()'s), or a module with parameters was compiled in place
        (`COMPILED_IN_PLACE`): a job that compiles only a loss function (or a loss module,
        which has none) takes its global hooks out, not leaving every eager module call to
        pay for them."""
        try:
            compiled = lambda m: getattr(m, "_compiled_call_impl", None) is not None
            if any(type(m).__name__ == "OptimizedModule" or compiled(m) for m in list(self.models)):
                return True
            return any(compiled(m) and next(iter(m.parameters()), None) is not None
                       for m in list(COMPILED_IN_PLACE))
        except Exception:
            return False

    def after_step(self):
        """On the job's thread, just after an optimizer step: read the roles if a state
        asked for them since the last reading, or if none was ever read (a job may step a
        few times and then pause: its states must still have a reading). Never raises."""
        if not self.wanted and self.at_step is not None:
            return
        self.wanted = False
        try:
            self.at_step = self.read(list(self.models), list(self.optimizers), grads=True,
                                     held=self.held_in_frames())
        except Exception:
            self.at_step = {}  # read again only when a state asks, not at every step
        self.at_step_time = time.time()

    def of(self, device):
        """For a state, on the hook's thread: {"parameters", "gradients", "optimizer_state",
        "trained", "frozen" (bytes; the last two split the parameters: `split_trained`),
        "models", "optimizers", "time_s" (when read)} for `device`, or None when
        nothing is known yet (it is asked for: the job's next step reads them)."""
        models, optimizers = list(self.models), list(self.optimizers)
        if optimizers:
            self.wanted = True
            figures = (self.at_step or {}).get(device)
            if figures is None:
                return None
            return dict(figures, time_s=self.at_step_time)
        if not models:
            return None
        try:  # no optimizer: no gradients to race; parameters read now
            figures = self.read(models, [], grads=False).get(device)
        except Exception:
            return None
        return dict(figures, time_s=time.time()) if figures else None

    def at_oom(self, device):
        """On the thread that hit the OOM (the job's, or autograd's in a backward, which
        alone writes this device's gradients): the roles now. Never raises."""
        models, optimizers = list(self.models), list(self.optimizers)
        if not models and not optimizers:
            return None
        in_forward = getattr(self.local, "depth", 0) > 0
        self.local.depth = 0  # a forward that ran out of memory never came back
        # The main thread, or a thread Python did not start (the autograd engine's, which
        # alone writes this device's gradients), may read them; another Python thread (a
        # prefetcher) may run beside a backward: it takes the last step's reading of them.
        current = threading.current_thread()
        in_backward = isinstance(current, getattr(threading, "_DummyThread", ()))
        own = current is threading.main_thread() or in_backward
        try:
            held = self.held_in_frames()  # reads no gradient: any thread may
            figures = self.read(models, optimizers, grads=own, device=device, held=held).get(device)
        except Exception:
            return None
        if not figures:
            return None
        if not own:
            figures["gradients"] = ((self.at_step or {}).get(device) or {}).get("gradients", 0)
        # Only inside the first pass's forward or its backward: after them (the optimizer's
        # own update, the next batch copied in before the next forward) a step may have
        # ended without a root module's forward running again.
        if (in_forward or in_backward) and self.in_first_pass():
            figures["first_pass"] = True
        return dict(figures, time_s=time.time())

    def in_first_pass(self):
        """Whether the job is still in its first pass through its models: a root module's
        forward has run, none has come round again, and the watch is still on (it ends
        MODELS_WATCH_S after the first). An OOM then came before any step or batch ended,
        so nothing done between steps (emptying the cache) would have come before it."""
        try:
            until = self.watch_until
            return bool(self.models) and not self.came_round and until is not None and time.monotonic() <= until
        except Exception:
            return False

    def held_in_frames(self):
        """Models the job holds by name that no forward found: an EMA of the weights
        (torch's AveragedModel, updated and never called in training; timm's ModelEma is a
        module holding its copy; diffusers' EMAModel keeps `shadow_params`), a model kept
        for evaluation. Their weights are parameters, not activations, and no optimizer
        trains them unless it holds them: they count as frozen (`read`).

        Every AveragedModel made since the hook came in (`watch_averaged`), and what the
        names of the frames of the job's thread that stepped or ran out hold (in a
        backward, on the autograd engine's thread, the main thread's, which waits in it),
        one level into an object, at most FRAMES_MAX frames of NAMES_MAX names. A
        function's locals are read only where Python reads them without a copy (3.13+,
        PEP 667): before it, `frame.f_locals` stores a copy of them on the frame, which
        keeps whatever the job rebinds or deletes alive until it is read again (a step's
        logits, its batch). So before 3.13 only a script's globals (and class bodies)
        are read. Returns a list of modules and tensor lists; never raises."""
        found, ids = [], set()

        def note(value):
            if id(value) not in ids:
                ids.add(id(value))
                found.append(value)

        try:
            for model in list(self.averaged):
                note(model)
        except Exception:
            pass
        module_type = getattr(getattr(self.torch, "nn", None), "Module", None)
        if not isinstance(module_type, type):
            return found
        try:
            current = threading.current_thread()
            if isinstance(current, getattr(threading, "_DummyThread", ())):
                current = threading.main_thread()
            frame = sys._current_frames().get(current.ident)
        except Exception:
            return found
        copies_locals = sys.version_info < (3, 13)
        depth = 0
        while frame is not None and depth < self.FRAMES_MAX:
            depth += 1
            try:
                if copies_locals and frame.f_code.co_flags & CO_OPTIMIZED:
                    values = []
                else:
                    values = list(frame.f_locals.values())[: self.NAMES_MAX]
            except Exception:
                values = []
            for value in values:
                try:
                    kind = type(value)
                    if issubclass(kind, module_type):
                        if value not in self.models:
                            note(value)
                        continue
                    if kind.__getattribute__ is not object.__getattribute__:
                        continue  # a proxy's attribute reads run its code
                    # The instance's own names, read without its __getattr__ (a lazy
                    # object's may import or compute).
                    names = object.__getattribute__(value, "__dict__")
                    if not isinstance(names, dict):
                        continue
                    inner = names.get("module")
                    if issubclass(type(inner), module_type) and inner not in self.models:
                        note(inner)
                    shadow = names.get("shadow_params")
                    if isinstance(shadow, list):
                        note(shadow)
                except Exception:
                    continue
            values = None
            frame = frame.f_back
        frame = None
        return found

    def watch_averaged(self):
        """Note each torch.optim.swa_utils.AveragedModel as it is made (an EMA or SWA of
        the weights; torchvision's ExponentialMovingAverage and Lightning's weight
        averaging are made on it): no forward runs it in training, and a function's
        locals are not read before Python 3.13 (`held_in_frames`). Its __init__ is
        wrapped once; the set is weak. Never raises."""
        try:
            module = sys.modules.get("torch.optim.swa_utils")
            if module is None and "torch.optim" in sys.modules:
                import importlib

                module = importlib.import_module("torch.optim.swa_utils")
            cls = getattr(module, "AveragedModel", None)
            if cls is None or getattr(cls.__init__, "_vramtop_averaged", False):
                return False
            original = cls.__init__
            averaged = self.averaged

            @functools.wraps(original)
            def __init__(model, *args, **kwargs):
                original(model, *args, **kwargs)
                try:
                    averaged.add(model)
                except Exception:
                    pass

            __init__._vramtop_averaged = True
            cls.__init__ = __init__
            return True
        except Exception:
            return False

    @staticmethod
    def split_trained(params, in_optimizers, out, local, on_device):
        """The parameters' bytes split into "trained" (an optimizer holds them and they need
        a gradient) and "frozen" (the rest: a distilling job's teacher, a LoRA model's base
        weights), each storage once, so that the optimizer's state is told against what it
        trains. A storage that any trained parameter shares is trained (FSDP1's flat
        parameter with use_orig_params, its views mixing both). Buffers are neither."""

        def storage_of(tensor):
            try:
                storage = local(tensor).untyped_storage()
                return storage, storage.data_ptr()
            except Exception:
                return None, 0

        trained = set()
        for p in in_optimizers:
            if getattr(p, "requires_grad", True) is not False:
                trained.add(storage_of(p)[1])
        counted = set()
        for p in params:
            tensor = local(p)
            storage, ptr = storage_of(p)
            if not ptr or ptr in counted or not on_device(tensor) or tensor.device.index not in out:
                continue
            counted.add(ptr)
            out[tensor.device.index]["trained" if ptr in trained else "frozen"] += int(storage.nbytes())

    def read(self, models, optimizers, grads, device=None, held=()):
        """{device: figures} over every CUDA device the tensors are on (only `device`'s
        when given: another device's gradients may be written by its autograd thread right
        now). A DTensor (FSDP2's sharded parameters, their gradients and optimizer state)
        counts by its local shard, which holds its memory; a tensor whose storage cannot be
        read is left out. `held` (`held_in_frames`): more models, or lists of tensors,
        whose weights are parameters too."""
        is_tensor = self.torch.is_tensor
        seen = set()
        out = {}

        def local(tensor):
            inner = getattr(tensor, "_local_tensor", None)
            return inner if inner is not None and is_tensor(inner) else tensor

        def on_device(tensor):
            return is_tensor(tensor) and tensor.is_cuda and (device is None or tensor.device.index == device)

        def add(role, tensor):
            tensor = local(tensor)
            if not on_device(tensor):
                return
            try:
                storage = tensor.untyped_storage()
                ptr = storage.data_ptr()
            except Exception:
                return
            if ptr and ptr not in seen:
                seen.add(ptr)
                figures = out.get(tensor.device.index)
                if figures is None:
                    figures = out[tensor.device.index] = {
                        "parameters": 0, "gradients": 0, "optimizer_state": 0,
                        "trained": 0, "frozen": 0,
                        "models": len(models), "optimizers": len(optimizers),
                    }
                figures[role] += int(storage.nbytes())

        params = []
        for model in models:
            params.extend(model.parameters())
            for buffer in model.buffers():
                add("parameters", buffer)
        for extra in held:
            try:
                if isinstance(extra, list):
                    params.extend(t for t in extra if is_tensor(t))
                else:
                    params.extend(extra.parameters())
                    for buffer in extra.buffers():
                        add("parameters", buffer)
            except Exception:
                continue  # a model that cannot list its weights: left to "other"
        in_optimizers = []
        for optimizer in optimizers:
            for group in list(optimizer.param_groups):
                in_optimizers.extend(group.get("params") or [])
        params.extend(in_optimizers)
        for p in params:
            add("parameters", p)
        if optimizers:
            self.split_trained(params, in_optimizers, out, local, on_device)
        if grads:
            for p in params:
                if not on_device(local(p)):
                    continue  # never touch another device's .grad
                grad = p.grad
                if grad is not None:
                    add("gradients", grad)
        for optimizer in optimizers:
            for state in list(optimizer.state.values()):
                for value in list(state.values()) if isinstance(state, dict) else []:
                    add("optimizer_state", value)
        for device, figures in out.items():
            totals = self.totals(device) if self.totals is not None else None
            if totals is not None:
                figures["allocated"], figures["reserved"] = totals
        return out


# Modules compiled in place (Module.compile()). Their calls run Dynamo's code, so the root
# pre-hook, traced in, never notes them; taking the global hooks out then failed the guard
# Dynamo keeps on their count and recompiled the model once (stop 65).
COMPILED_IN_PLACE = weakref.WeakSet()


def note_in_place_compiles(module_class):
    """Wrap Module.compile (PyTorch 2.2+) to note each module it compiles, once per process.
    Never raises; a torch without it is left as it is."""
    original = getattr(module_class, "compile", None)
    if original is None or getattr(original, "_vramtop_original", None) is not None:
        return

    def compile(module, /, *args, **kwargs):
        try:
            COMPILED_IN_PLACE.add(module)
        except Exception:
            pass
        return original(module, *args, **kwargs)

    try:
        functools.update_wrapper(compile, original)  # as GradScaler.step's wrapper
        compile._vramtop_original = original
        module_class.compile = compile
    except Exception:
        pass


def dynamo_compiled():
    """Whether torch.compile has compiled any graph in this process (Dynamo's own counters;
    False where Dynamo was never imported). Never raises."""
    try:
        utils = sys.modules.get("torch._dynamo.utils")
        stats = getattr(utils, "counters", {}).get("stats") if utils is not None else None
        return bool(stats) and stats.get("unique_graphs", 0) > 0
    except Exception:
        return False


class PassMarks:
    """Where the job's steps begin when no step of its is marked: a GradScaler skipping its
    first steps (fp16: its scale too high, the optimizer's step not run, so not marked), a
    hand-written update, an optimizer outside torch.optim. A GPT-2 in fp16 whose scaler
    skipped its first 19 steps (H200, PyTorch 2.11, a 15.3 GiB cap) ran out in its second,
    and with no mark its first could not tell how far the second would rise.

    A step begins at a forward of the first root module the job ran with a trainable
    parameter (`follow`), in training with gradients on, that comes after a backward
    through that module's output, where the gradient the backward left on a parameter of
    the module (`after_backward`) was since released (`zero_grad()`), replaced or changed
    in place (a hand-written update, zeroing in place). Where it is untouched the job is
    accumulating gradients over micro-batches: no step has ended (counted: `accumulating`).
    A model called twice before its backward (a Siamese loss), an inference or evaluation
    pass, a forward run inside a backward (a checkpointed recompute), and a module none of
    whose parameters holds a gradient after its backward (DeepSpeed's ZeRO keeps them in
    its own buffers) mark nothing. The gradient is read after every callback the backward
    queued (DDP's reducer copies the reduced gradients back in one), each backward.

    Module-local hooks on that one module: two calls a pass, a hook on its output's grad_fn
    and one callback at the backward's end. They go at the job's first marked step
    (`stepped`): its marks say then where steps are. Never raises into the job."""

    def __init__(self, torch, marks, stepped):
        self.torch = torch
        self.marks = marks  # time.time() of each step's start, appended
        self.stepped = stepped  # () -> whether a step was marked (optimizer or vramtop.step())
        self.handles = []
        self.followed = False
        self.module = None  # weakref to the followed module
        self.param = None  # weakref to a parameter of it that its backward gives a gradient
        self.backward_ran = False
        self.pending = False  # a check queued for the end of the running backward
        # The followed parameter's gradient as the last backward left it: (weakref to it,
        # its _version), or None where that was not seen (the check did not run).
        self.left = None
        self.blind = False  # no parameter of the module holds a gradient after a backward
        # Forwards begun after a backward with the gradients kept (`accumulating`).
        self.kept = 0

    def accumulating(self):
        """At an OOM: how many times the followed model's forward ran again after a
        backward with its gradients untouched, where no step or pass was marked: the job was
        accumulating gradients in its first step, and the rest of that step is not in its
        history. 0 otherwise."""
        try:
            if self.kept and not self.marks and not self.stepped():
                return self.kept
        except Exception:
            pass
        return 0

    def after_backward(self):
        """At the end of a backward through the followed module (the autograd engine's
        final callback; the job's thread waits in backward()): which gradient it left.
        Never raises."""
        try:
            param = self.param() if self.param is not None else None
            grad = getattr(param, "grad", None)
            if grad is None:
                # That parameter got none (unused, or not in this rank's shard): another.
                module = self.module() if self.module is not None else None
                param = next((p for p in module.parameters() if p.requires_grad and p.grad is not None),
                             None) if module is not None else None
                if param is None:
                    self.blind = True
                    return
                grad = param.grad
                self.param = weakref.ref(param)
            self.left = (weakref.ref(grad), grad._version)
        except Exception:
            self.left = None
        finally:
            self.pending = False

    def step_began(self):
        """At a forward after a backward: True where the gradient that backward left is
        gone, replaced or changed since (a step ended); False where it is untouched (the job
        accumulates); None where that cannot be told (the followed parameter gone, or a
        gradient there and the backward's end not seen)."""
        param = self.param() if self.param is not None else None
        if param is None:
            return None
        grad = param.grad
        if grad is None:
            return True
        if self.left is None:
            return None
        made, version = self.left
        return made() is not grad or grad._version != version

    def follow(self, module):
        """Told each new root module: the first with a trainable parameter is followed (a
        frozen encoder run before the trained model is not)."""
        if self.followed:
            return
        try:
            param = next((p for p in module.parameters() if p.requires_grad), None)
            if param is None:
                return  # nothing trained in it
            self.followed = True
            if self.stepped():
                return  # steps marked already
            self.module = weakref.ref(module)
            self.param = weakref.ref(param)
            torch = self.torch
            compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
            grad_enabled = getattr(torch, "is_grad_enabled", None) or (lambda: True)
            engine = getattr(getattr(getattr(torch, "autograd", None), "Variable", None), "_execution_engine", None)
            # -1 outside any backward: a forward run inside one (a checkpointed recompute)
            # begins no step.
            graph_task = getattr(getattr(torch, "_C", None), "_current_graph_task_id", None) or (lambda: -1)
            marks = self

            def _vramtop_after_the_others():
                # DDP's reducer queues its own end-of-backward callback (which copies the
                # reduced gradients in place) after ours: queued again from here, ours runs
                # after every callback the backward queued.
                try:
                    engine.queue_callback(marks.after_backward)
                except Exception:
                    marks.pending = False

            def _vramtop_pass_pre(module, args):
                if compiling():
                    return None
                try:
                    if marks.stepped() or marks.blind:
                        marks.stop()
                        return None
                    if not (grad_enabled() and getattr(module, "training", True)) or graph_task() != -1:
                        return None  # an evaluation pass, or a recompute in a backward
                    marks.pending = False  # no backward runs: a check not run never will
                    if marks.backward_ran:
                        marks.backward_ran = False
                        began = marks.step_began()
                        if began:
                            marks.marks.append(time.time())
                        elif began is not None:
                            marks.kept += 1
                        marks.left = None
                except Exception:
                    pass
                return None

            def _vramtop_backward_ran(grad_outputs):
                if compiling():
                    return None
                # Once a backward (each output's node may call it; a second backward of the
                # same forward is checked again): check its end.
                marks.backward_ran = True
                if not marks.pending:
                    marks.pending = True
                    try:
                        engine.queue_callback(_vramtop_after_the_others)
                    except Exception:
                        marks.pending = False
                return None

            def _vramtop_pass_post(module, args, output):
                if compiling():
                    return None
                try:
                    for tensor in tensors_of(output, torch.is_tensor):
                        node = getattr(tensor, "grad_fn", None)
                        if node is not None:
                            node.register_prehook(_vramtop_backward_ran)
                except Exception:
                    pass
                return None

            self.handles = [
                module.register_forward_pre_hook(_vramtop_pass_pre),
                module.register_forward_hook(_vramtop_pass_post),
            ]
        except Exception:
            self.stop()

    def stop(self):
        handles, self.handles = self.handles, []
        remove_all(handles)


def remove_all(handles):
    """Takes out each hook's handle; never raises."""
    for handle in handles:
        try:
            handle.remove()
        except Exception:
            pass


def tensors_of(output, is_tensor, limit=8):
    """The first `limit` tensors of a module's output: a tensor, or one in a tuple, a list
    or a dict (a Hugging Face ModelOutput is one), two levels deep at most."""
    found = []
    level = [output]
    for _ in range(3):
        nested = []
        for item in level:
            if is_tensor(item):
                found.append(item)
                if len(found) >= limit:
                    return found
            elif isinstance(item, dict):
                nested.extend(item.values())
            elif isinstance(item, (tuple, list)):
                nested.extend(item)
        level = nested
    return found


class AllocatedSeries:
    """The allocated bytes of each device over the job's life: rows [time_s, low, high]
    (time.time(); the lowest and highest sample the row covers). Kept at an OOM so a leak
    can be told without the allocation history."""

    def __init__(self, period=SERIES_PERIOD_S, limit=SERIES_MAX):
        self.period = period
        self.limit = limit
        self.rows = {}  # device -> [[time_s, low, high], ...]
        self.spans = {}  # device -> the time a row covers now (doubles at each merge)
        self.next_due = 0.0

    def add(self, device, time_s, allocated):
        rows = self.rows.setdefault(device, [])
        rows.append([time_s, allocated, allocated])
        if len(rows) >= self.limit:
            merged = []
            for i in range(0, len(rows) - 1, 2):
                a, b = rows[i], rows[i + 1]
                merged.append([a[0], min(a[1], b[1]), max(a[2], b[2])])
            if len(rows) % 2:
                merged.append(rows[-1])
            self.rows[device] = merged
            self.spans[device] = 2 * self.spans.get(device, self.period)
            # Samples come at the slowest device's pace from then on (rows carry times).
            self.period = max(self.period, self.spans[device])

    def due(self, now):
        if now < self.next_due:
            return False
        self.next_due = now + self.period
        return True

    def of(self, device):
        return {"period_s": self.spans.get(device, self.period), "rows": [list(r) for r in self.rows.get(device, [])]}
