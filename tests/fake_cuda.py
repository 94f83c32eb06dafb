"""A GPU step checked on the CPU: the project's real code run on fake CUDA tensors, every host wait and launch counted.

`FakeCuda` tensors say they live on `cuda:0`, so the code takes its GPU branches (cuDNN's `nn.LSTM`, the char CNN on
every position, the weights cast for CUDA autocast, `is_cuda` tests), while the CPU computes their values. Inside a
`DeviceWatch` (a `TorchDispatchMode` and a `TorchFunctionMode`), every aten operation on them runs on the CPU and is
classified as a GPU would see it:

- **host waits** (`watch.syncs`), each with the project line that caused it: `.item()` / `bool()` / `int()` of a
  tensor (`_local_scalar_dense`), operations whose output shape depends on the values (`nonzero`, `masked_select`,
  `unique*`, `repeat_interleave` without `output_size`, boolean-mask indexing), copies device -> host, and blocking
  copies host -> device (a tensor made from host data with `torch.tensor(..., device=...)`, a list or CPU tensor
  used as an index of a device tensor, `.to(device)` without `non_blocking`);
- **transfers** (`watch.transfers`): non-blocking host -> device copies, which wait for nothing;
- **launches** (`watch.launches`): every operation that computes (views, allocations and metadata left out), by
  name: about one kernel launch each. A fused `nn.LSTM` (`torch._VF.lstm`) counts as one `cudnn_rnn`, forward and
  backward, as cuDNN runs it (the CPU computes it step by step behind it).

Host waits seen besides the operations: `repr` / `str` / f-strings / logging of a device tensor (each formats its
values on the host), `torch.allclose` and `torch.equal` (a bool back), `torch.cuda.synchronize()`. Inside the watch
`torch.cuda.is_available()` is True, so the code's GPU-only branches run (`pin_memory()` gives the tensor itself, as
pinned). CUDA autocast runs as on a GPU (`autocast(dtype)`; the code's own `torch.autocast("cuda")` is let through).
Tensors a GPU would reject (a CPU tensor of more than one element next to a device tensor) fail as they would there.
`fake_thinc()` stands thinc's arrays in for CuPy's (`DeviceArray`): they cross to torch without a copy (DLPack on a
GPU), a host read of one (`int()`, `float()`, `bool()`, `.item()`, `.tolist()`, `repr`) is a host wait, and the
project's own `ops.to_numpy` calls count as device -> host copies.

What stays invisible: waits inside cuDNN, cuBLAS or CuPy themselves; thinc's and spaCy's own CuPy kernels (NumPy
computes them here, some through paths CuPy would not take); the cost of a launch; kernels that exist only on a GPU
(TF32 matmuls, cuDNN's algorithm search); memory (sizes, fragmentation, out-of-memory); streams and their ordering
(everything here runs in program order); the CUDA calls of torch.cuda's other functions (memory statistics, RNG
states: the CPU build has none); and a host read of a "CuPy" array made outside thinc's `alloc` / `asarray` and the
torch crossing (NumPy functions called directly on the host).

It relies on private torch APIs (`_make_wrapper_subclass`, the Python PrivateUse1 backend, dispatch keys):
`TORCH_RANGE` is the torch versions it was checked against; outside it a `DeviceWatch` fails with one line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

# The torch versions whose private APIs this module was checked against: [first, past the last).
TORCH_RANGE = ((2, 13), (2, 14))
aten = torch.ops.aten
DEVICE = torch.device("cuda", 0)
# Where the fake tensors live for torch's C++ side: PrivateUse1, set up as a Python backend with a device guard (the
# CPU build has no CUDA guard, which indexing and `copy_` need); Python code sees `DEVICE`.
BACKEND = "fakecuda"
FAKE_DEVICE_TYPES = ("cuda", BACKEND)
REPO = Path(__file__).resolve().parents[1]
PROJECT = tuple(str(REPO / package) for package in ("hf_elmo", "spacy_elmo", "recipes"))
# Libraries whose own reads of arrays `Event.project` leaves out (they compute on CuPy's arrays on a GPU).
THIRD_PARTY_ARRAYS = ("/thinc/", "/spacy/")

# Operations that make the host wait for the device whatever their arguments.
SYNCHRONISING = {
    aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default, aten._unique.default,
    aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
    aten.unique_dim_consecutive.default, aten.equal.default, aten.allclose.default, aten.bincount.default,
}
# Operations that launch no kernel: allocations, metadata, tensors made on the host.
NO_KERNEL = {
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default, aten.new_empty.default,
    aten.new_empty_strided.default, aten.lift_fresh.default, aten.detach.default, aten.alias.default,
    aten._local_scalar_dense.default, aten.set_.source_Storage, aten.set_.source_Storage_storage_offset,
    aten.resize_.default, aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.is_same_size.default,
}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
# Operations of which some outputs stay on the host on a GPU too (packed sequences' batch sizes and lengths).
HOST_OUTPUTS = {aten._pack_padded_sequence.default: (1,), aten._pad_packed_sequence.default: (1,)}


class FakeCuda(torch.Tensor):
    """A tensor on `cuda:0` whose values a CPU tensor (`elem`) holds."""

    elem: torch.Tensor
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, elem: torch.Tensor, requires_grad: bool | None = None) -> FakeCuda:
        elem = elem.detach()
        out = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            layout=elem.layout, device=torch.device(BACKEND, 0),
            requires_grad=elem.requires_grad if requires_grad is None else requires_grad,
        )
        out.elem = elem
        return out

    device = property(lambda self: DEVICE)
    is_cuda = property(lambda self: True)

    def data_ptr(self) -> int:
        return self.elem.data_ptr()

    def __repr__(self) -> str:
        """Its values, read on the host: `str`, f-strings and logging come here too."""
        _record_host_read("device->host copy (repr)")
        return f"FakeCuda({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _compute(func, args, kwargs or {}, None)


def torch_problem(version: str = torch.__version__) -> str | None:
    """Why this module cannot run on torch `version` (one line), or None inside `TORCH_RANGE`."""
    release = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    first, past = TORCH_RANGE
    if first <= release < past:
        return None
    return (f"tests/fake_cuda.py runs on torch >={'.'.join(map(str, first))},<{'.'.join(map(str, past))} (it uses "
            f"torch's private APIs), not {version}: check it against this torch and widen TORCH_RANGE")


def _record_host_read(op: str) -> None:
    """A host read of device values, seen by the active `DeviceWatch` (none outside one)."""
    watch = _get_current_dispatch_mode()
    if isinstance(watch, DeviceWatch):
        watch.record("sync", op, None)


def fake_cuda(value: Any) -> Any:
    """`value` (a tensor, a module, or a structure of tensors) on the fake device; modules in place."""
    if isinstance(value, torch.nn.Module):
        return value._apply(lambda t: t if isinstance(t, FakeCuda) else FakeCuda(t, t.requires_grad))
    return pytree.tree_map_only(torch.Tensor, lambda t: t if isinstance(t, FakeCuda) else FakeCuda(t), value)


def real(value: Any) -> Any:
    """`value` with every fake CUDA tensor replaced by its CPU values."""
    return pytree.tree_map_only(FakeCuda, lambda t: t.elem, value)


@dataclass(frozen=True)
class Event:
    """A host wait or a transfer: its kind, the operation, and where it came from (the innermost project line, else
    the innermost line outside torch)."""

    kind: str
    op: str
    where: str

    @property
    def project(self) -> bool:
        """Whether a line of the project's code caused it."""
        return self.where.startswith(tuple(Path(p).name for p in PROJECT))

    def __str__(self) -> str:
        return f"{self.kind} ({self.op}) at {self.where}"


def _origin() -> str:
    frames = [f for f in traceback.extract_stack() if not f.filename.endswith(("fake_cuda.py", "contextlib.py"))]
    project = [f for f in frames if f.filename.startswith(PROJECT)]
    outside = [f for f in frames if not any(part in f.filename for part in ("/torch/", "/numpy/"))]
    # thinc's and spaCy's own reads are theirs, even when the project's code called them
    theirs = outside[-1:] if outside and any(part in outside[-1].filename for part in THIRD_PARTY_ARRAYS) else []
    frame = (theirs or project or outside or frames)[-1]
    name = Path(frame.filename)
    shown = name.relative_to(REPO) if name.is_relative_to(REPO) else name.name
    return f"{shown}:{frame.lineno} ({frame.name})"


def _is_host(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, FakeCuda) and value.device.type == "cpu"


def _compute(func, args: tuple, kwargs: dict, watch: DeviceWatch | None) -> Any:
    """Run `func` on the CPU values, as a GPU would: record what it costs the host in `watch`, give back fake
    CUDA tensors where a GPU gives device tensors."""
    leaves = pytree.tree_leaves((args, kwargs))
    on_device = any(isinstance(x, FakeCuda) for x in leaves)
    device = kwargs.get("device")
    to_device = device is not None and torch.device(device).type in FAKE_DEVICE_TYPES
    record = watch.record if watch is not None else (lambda *a: None)
    if not on_device and not to_device:
        return func(*args, **kwargs)
    if func is aten._to_copy.default:
        source = args[0]
        if to_device and _is_host(source):
            record("transfer" if kwargs.get("non_blocking") else "sync", "host->device copy", func)
        elif device is not None and not to_device:
            record("sync", "device->host copy", func)
            return func(real(args[0]), **kwargs)
    elif func is aten.copy_.default:
        destination, source = args[0], args[1]
        if isinstance(destination, FakeCuda) and _is_host(source):
            record("transfer" if kwargs.get("non_blocking", args[2:3] == (True,)) else "sync", "host->device copy",
                   func)
        elif _is_host(destination) and isinstance(source, FakeCuda):
            record("sync", "device->host copy", func)
            return func(destination, source.elem, *args[2:], **kwargs)
    elif func in SYNCHRONISING or (func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None):
        record("sync", func.__name__, func)
    elif func in INDEXING:
        indices = [i for i in pytree.tree_leaves(args[1]) if isinstance(i, torch.Tensor)]
        if any(i.dtype in (torch.bool, torch.uint8) for i in indices):
            record("sync", f"{func.__name__} with a boolean mask", func)
        elif any(_is_host(i) for i in indices):
            record("sync", f"{func.__name__} with a host index", func)
    elif func not in HOST_OUTPUTS:
        host = [x for x in leaves if _is_host(x) and x.dim() > 0]
        if host:
            raise RuntimeError(f"{func}: a CPU tensor of shape {tuple(host[0].shape)} next to cuda:0 tensors: on a "
                               f"GPU this fails with 'Expected all tensors to be on the same device' ({_origin()})")
    if watch is not None and func not in NO_KERNEL and not func.is_view:
        watch.launch(func.__name__.split(".")[0])
    cpu_kwargs = {**kwargs, "device": torch.device("cpu")} if to_device else kwargs
    outputs = func(*real(args), **real(cpu_kwargs))
    if func is aten._local_scalar_dense.default:
        return outputs
    host_outputs = HOST_OUTPUTS.get(func, ())
    if isinstance(outputs, tuple):
        return tuple(o if i in host_outputs or not isinstance(o, torch.Tensor) else _wrap_like(o, args)
                     for i, o in enumerate(outputs))
    return pytree.tree_map_only(torch.Tensor, lambda o: _wrap_like(o, args), outputs)


def _wrap_like(output: torch.Tensor, args: tuple) -> torch.Tensor:
    """An output as a fake CUDA tensor; an in-place operation gives back its own (fake) argument."""
    for argument in pytree.tree_leaves(args):
        if isinstance(argument, FakeCuda) and argument.elem is output:
            return argument
    return FakeCuda(output)


def _float32(value: Any) -> Any:
    return pytree.tree_map_only(torch.Tensor, lambda t: t.float() if t.is_floating_point() else t, value)


class _OneKernel(torch.autograd.Function):
    """A function of fake CUDA tensors computed on their CPU values behind one launch forward and one backward
    (cuDNN's RNN)."""

    @staticmethod
    def forward(ctx, watch, function, spec, *flat):
        ctx.watch, ctx.function, ctx.spec = watch, function, spec
        ctx.save_for_backward(*[x if isinstance(x, torch.Tensor) else None for x in flat])
        ctx.others = [None if isinstance(x, torch.Tensor) else x for x in flat]
        with watch.quiet(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "LSTM with projections is not supported with oneDNN")
            outputs = function(*pytree.tree_unflatten(_float32(real(list(flat))), spec))
        dtype = flat[0].dtype  # the CPU's LSTM takes float32 alone: computed in it, given in the input's dtype
        return tuple(FakeCuda(o.to(dtype)) for o in pytree.tree_leaves(outputs))

    @staticmethod
    def backward(ctx, *grads):
        saved = [t if t is not None else o for t, o in zip(ctx.saved_tensors, ctx.others)]
        needs = [isinstance(x, torch.Tensor) and x.requires_grad for x in saved]
        inputs = [_float32(real(x)).detach().requires_grad_(n) if isinstance(x, torch.Tensor) else x
                  for x, n in zip(saved, needs)]
        ctx.watch.launch("cudnn_rnn_backward")
        with ctx.watch.quiet(), torch.enable_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "LSTM with projections is not supported with oneDNN")
            outputs = pytree.tree_leaves(ctx.function(*pytree.tree_unflatten(inputs, ctx.spec)))
            wanted = [x for x, n in zip(inputs, needs) if n]
            pairs = [(o, _float32(real(g))) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
            found = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True) \
                if wanted and pairs else [None] * len(wanted)
        dtypes = iter(x.dtype for x, n in zip(saved, needs) if n)
        found = iter(None if g is None else FakeCuda(g.to(next(dtypes))) for g in found)
        return (None, None, None, *[next(found) if n else None for n in needs])


# -- CUDA autocast on the fake device: CUDA's cast policy (aten/src/ATen/autocast_mode.cpp), for the ops it names ------

LOWER_PRECISION = ("conv1d", "conv2d", "convolution", "_convolution", "prelu", "addmm", "addmv", "addr", "matmul",
                   "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
                   "linalg_multi_dot", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
                   "scaled_dot_product_attention")
FLOAT32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
           "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm", "cosine_similarity",
           "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
           "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "soft_margin_loss",
           "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp")
FLOAT32_DTYPE_ARGUMENT = ("prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "sum")
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "index_put", "tensordot", "scatter_add")
_registrations: list = []
_casts = torch.utils.weak.WeakIdKeyDictionary()  # a parameter -> its cast in the autocast dtype (autocast's cache)


def _setup_backend() -> None:
    """PrivateUse1 as a Python backend with CUDA's autocast policy, once per process."""
    if _registrations:
        return
    torch.utils.backend_registration._setup_privateuseone_for_python_backend(rename=BACKEND)
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    kernels = torch.library.Library("aten", "IMPL")
    for names, policy in ((LOWER_PRECISION, "lower"), (FLOAT32, "float32"), (FLOAT32_DTYPE_ARGUMENT, "dtype"),
                          (PROMOTE, "promote")):
        for name in names:
            packet = getattr(aten, name, None)
            for overload in packet.overloads() if packet is not None else ():
                op = getattr(packet, overload)
                if any(a.name == "out" for a in op._schema.arguments) or op._schema.is_mutable:
                    continue
                kernels.impl(op, _autocast_kernel(op, policy), "AutocastPrivateUse1")
    _registrations.extend([fallback, kernels])


def _eligible(value: Any) -> bool:
    return isinstance(value, FakeCuda) and value.is_floating_point() and value.dtype != torch.float64


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if not _eligible(value) or value.dtype == dtype:
        return value
    if dtype != torch.float32 and value.dtype == torch.float32 and value.requires_grad and value.is_leaf:
        cached = _casts.get(value)
        if cached is None or cached.dtype != dtype:
            cached = _casts[value] = value.to(dtype)
        return cached
    return value.to(dtype)


def _autocast_kernel(op: Any, policy: str) -> Callable:
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
    takes_dtype = any(a.name == "dtype" for a in op._schema.arguments)

    def kernel(*args, **kwargs):
        tensors = [x for x in pytree.tree_leaves((args, kwargs)) if _eligible(x)]
        if policy == "lower":
            dtype = torch.get_autocast_dtype(BACKEND)
        elif policy == "promote":
            dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors], tensors[0].dtype) if tensors \
                else None
        elif policy == "dtype" and takes_dtype and kwargs.get("dtype") is None and any(
                t.dtype != torch.float32 for t in tensors):
            kwargs, dtype = {**kwargs, "dtype": torch.float32}, None
        else:
            dtype = torch.float32 if policy == "float32" else None
        if dtype is not None:
            args, kwargs = pytree.tree_map(lambda x: _cast(x, dtype), (args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(keys):
            return op(*args, **kwargs)

    return kernel


# At import: autograd's engine sizes its device queues at the first backward of the process, which must see the
# fake device (test modules are imported before any test runs). Not beside a real GPU: a PrivateUse1 backend would
# become torch's accelerator there (its pinned memory, its device guard), and the CUDA tests check the device itself.
AVAILABLE = not torch.cuda.is_available()
if AVAILABLE and torch_problem() is None:
    _setup_backend()
    # The backend is torch's accelerator now (`torch.accelerator.current_accelerator()`), which Accelerate 1.16 on
    # trains on: the tests' `Accelerator`s stay on the CPU, as on the CPU-only machines they run on.
    os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    # What Accelerate still asks of the accelerator (`free_memory` empties its cache): the fake device holds nothing.
    torch.accelerator.empty_cache = lambda: None


class _Functions(TorchFunctionMode):
    """Every torch function: the fake device's autocast follows CUDA's (`torch.autocast("cuda")` sets CUDA's, which
    the code reads); `torch._VF.lstm` on fake CUDA tensors as one cuDNN launch."""

    def __init__(self, watch: DeviceWatch):
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        enabled = torch.is_autocast_enabled("cuda")
        if enabled != torch.is_autocast_enabled(BACKEND):
            torch.set_autocast_enabled(BACKEND, enabled)
            if not enabled:
                _casts.clear()
        if enabled:
            torch.set_autocast_dtype(BACKEND, torch.get_autocast_dtype("cuda"))
        name = getattr(func, "__name__", "")
        if name in ("tolist", "numpy") and args and isinstance(args[0], FakeCuda):
            if name == "numpy":
                raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                                "to host memory first.")
            self.watch.record("sync", "device->host copy (tolist)", func)
            return args[0].elem.tolist()
        if name == "lstm" and isinstance(args[0], FakeCuda) and not self.watch.quieted:
            self.watch.launch("cudnn_rnn")
            flat, spec = pytree.tree_flatten((args, kwargs))
            outputs = _OneKernel.apply(self.watch, lambda a, k: func(*a, **k), spec, *flat)
            return tuple(outputs)
        return func(*args, **kwargs)


class DeviceWatch(TorchDispatchMode):
    """Runs fake CUDA tensors and records, inside `recording()`, their host waits, transfers and launches."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[Event] = []
        self.transfers: list[Event] = []
        self.launches: Counter = Counter()
        self.launch_origins: Counter = Counter()  # with `trace_launches`: by operation and project line
        self.trace_launches = False
        self.recording_now = False
        self.quieted = 0
        self._stack = contextlib.ExitStack()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _compute(func, args, kwargs or {}, self)

    def record(self, kind: str, op: str, func: Any) -> None:
        if self.recording_now and not self.quieted:
            (self.syncs if kind == "sync" else self.transfers).append(Event(kind, op, _origin()))

    def launch(self, name: str) -> None:
        if self.recording_now and not self.quieted:
            self.launches[name] += 1
            if self.trace_launches:
                self.launch_origins[f"{name} at {_origin()}"] += 1

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        self.quieted += 1
        try:
            yield
        finally:
            self.quieted -= 1

    @contextlib.contextmanager
    def recording(self) -> Iterator[DeviceWatch]:
        """Count what runs inside from zero."""
        self.syncs, self.transfers, self.launches, self.launch_origins = [], [], Counter(), Counter()
        self.recording_now = True
        try:
            yield self
        finally:
            self.recording_now = False

    @property
    def launch_count(self) -> int:
        return sum(self.launches.values())

    def __enter__(self) -> DeviceWatch:
        if problem := torch_problem():
            import pytest

            pytest.fail(problem, pytrace=False)
        stack = self._stack
        # The code's GPU-only branches run: torch.cuda says a device is here.
        stack.enter_context(mock.patch("torch.cuda.is_available", lambda: True))
        stack.enter_context(mock.patch("torch.cuda.device_count", lambda: 1))
        stack.enter_context(mock.patch("torch.cuda.current_device", lambda: 0))
        stack.enter_context(mock.patch("torch.cuda.synchronize", lambda *a, **k: _record_host_read("synchronize")))
        stack.enter_context(mock.patch.object(torch.Tensor, "pin_memory", lambda self, *a, **k: self))
        # Tensors made from host data are made on the host, then copied (a copy this mode sees), as FakeTensor does.
        only_cpu = torch._C._only_lift_cpu_tensors()
        torch._C._set_only_lift_cpu_tensors(True)
        stack.callback(torch._C._set_only_lift_cpu_tensors, only_cpu)
        # `.to("cuda")` and factories with device="cuda" set up no CUDA runtime.
        stack.enter_context(mock.patch("torch.cuda._lazy_init", lambda: None))
        # The code's own torch.autocast("cuda") works as on a GPU with bf16.
        stack.enter_context(mock.patch("torch.cuda.amp.common.amp_definitely_not_available", lambda: False))
        stack.enter_context(mock.patch("torch.cuda.is_bf16_supported", lambda *a, **k: True))
        # Optimizers and gradient clipping take their multi-tensor (foreach) kernels, as for CUDA tensors.
        for module in map(importlib.import_module, ("torch.optim.optimizer", "torch.utils._foreach_utils")):
            stack.enter_context(mock.patch.object(module, "_foreach_supported_types",
                                                  [*module._foreach_supported_types, FakeCuda]))
        stack.enter_context(_Functions(self))
        super().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._stack.close()


@contextlib.contextmanager
def autocast(dtype: torch.dtype | None) -> Iterator[None]:
    """CUDA autocast in `dtype` (None: off), as `torch.autocast("cuda", dtype)` on a GPU."""
    enabled, previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", dtype is not None)
    if dtype is not None:
        torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", previous)
        torch.clear_autocast_cache()


# -- thinc's arrays as CuPy's -------------------------------------------------------------------------------------


def _to_torch(array: Any, requires_grad: bool = False) -> torch.Tensor:
    tensor = FakeCuda(torch.from_numpy(np.asarray(array).view(np.ndarray)))
    return tensor.requires_grad_() if requires_grad else tensor


def _to_xp(tensor: torch.Tensor, ops: Any) -> Any:
    tensor = tensor.detach().contiguous()
    return _on_device(tensor.elem.numpy() if isinstance(tensor, FakeCuda) else tensor.numpy())


def _optimizer_array(tensor: torch.Tensor) -> Any:
    return _on_device(tensor.elem.numpy() if isinstance(tensor, FakeCuda) else tensor.numpy())


class DeviceArray(np.ndarray):
    """A NumPy array standing in for a CuPy one: reading its values on the host is a host wait (a CuPy array copies
    them from the device first). Elements and reductions stay `DeviceArray`s (0-d), as CuPy's do."""

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        return value if isinstance(value, np.ndarray) else np.asarray(value).view(DeviceArray)

    def __array_wrap__(self, array: np.ndarray, context: Any = None, return_scalar: bool = False) -> DeviceArray:
        return np.asarray(array).view(DeviceArray)  # never a NumPy scalar: a result stays on the device

    def argmax(self, *args: Any, **kwargs: Any) -> DeviceArray:
        return np.asarray(super().argmax(*args, **kwargs)).view(DeviceArray)

    def argmin(self, *args: Any, **kwargs: Any) -> DeviceArray:
        return np.asarray(super().argmin(*args, **kwargs)).view(DeviceArray)

    def _read(self, op: str) -> np.ndarray:
        _record_host_read(f"device->host copy ({op} of a CuPy array)")
        return self.view(np.ndarray)

    def __int__(self) -> int:
        return int(self._read("int"))

    def __float__(self) -> float:
        return float(self._read("float"))

    def __bool__(self) -> bool:
        return bool(self._read("bool"))

    def __index__(self) -> int:
        return self._read("index").__index__()

    def item(self, *args: Any) -> Any:
        return self._read("item").item(*args)

    def tolist(self) -> Any:
        return self._read("tolist").tolist()

    def __repr__(self) -> str:
        return repr(self._read("repr"))

    def __format__(self, spec: str) -> str:
        return format(self._read("format"), spec)


def _on_device(value: Any) -> Any:
    return value.view(DeviceArray) if isinstance(value, np.ndarray) and not isinstance(value, DeviceArray) else value


class _DeviceNumpy:
    """NumPy under another name: `ops.xp is numpy` is False, as for CuPy, so the project's code takes its GPU path;
    its functions give `DeviceArray`s (its ufuncs do, given one)."""

    def __getattr__(self, name: str) -> Any:
        value = getattr(np, name)
        if isinstance(value, (np.ufunc, type)) or not callable(value):
            return value
        return functools.wraps(value)(lambda *args, **kwargs: pytree.tree_map_only(
            np.ndarray, _on_device, value(*args, **kwargs)))


@contextlib.contextmanager
def fake_thinc(watch: DeviceWatch, ops: Any) -> Iterator[None]:
    """thinc's arrays stand in for CuPy's (`ops` is the NumpyOps instance the pipeline's models hold): `ops.xp` is not
    NumPy, `ops.alloc` / `ops.asarray` and the torch crossings give `DeviceArray`s, `to_torch` / `to_xp` cross to
    fake CUDA tensors without a copy (DLPack on a GPU), and `ops.to_numpy` counts as a device -> host copy (thinc's
    and spaCy's own too: `Event.project` tells them apart)."""
    from spacy_elmo.layers import elmo_torch, pytorch, scalar_mix

    to_numpy: Callable = ops.to_numpy

    def counted_to_numpy(data: Any, *args, **kwargs) -> np.ndarray:
        watch.record("sync", "ops.to_numpy (device->host copy)", None)
        return np.asarray(to_numpy(data, *args, **kwargs)).view(np.ndarray)

    def on_device(method: Callable) -> Callable:
        return lambda *args, **kwargs: _on_device(method(*args, **kwargs))

    with contextlib.ExitStack() as stack:
        for module in (pytorch, elmo_torch, scalar_mix):
            for name, function in (("to_torch", _to_torch), ("to_xp", _to_xp), ("_array", _optimizer_array)):
                if hasattr(module, name):
                    stack.enter_context(mock.patch.object(module, name, function))
        stack.enter_context(mock.patch.object(ops, "to_numpy", counted_to_numpy))
        for name in ("alloc", "asarray"):
            stack.enter_context(mock.patch.object(ops, name, on_device(getattr(ops, name))))
        stack.enter_context(mock.patch.object(ops, "xp", _DeviceNumpy()))
        yield
