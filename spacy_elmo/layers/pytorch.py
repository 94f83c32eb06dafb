"""torch inside Thinc: arrays that cross without copies or deprecated calls, a shim that trains and saves torch modules
the way this plugin needs, and the wrapper of modules that read padded sequences (the task biLSTM, the BCN encoder).

- `to_torch` / `to_xp`: NumPy or CuPy arrays ↔ torch tensors sharing memory: `torch.from_numpy` on the CPU, DLPack's
  protocol (`torch.from_dlpack`, `cupy.from_dlpack`) on a GPU. Thinc's `xp2torch` / `torch2xp` call CuPy's
  deprecated `toDlpack` / `fromDlpack`, which warn at every call.
- `TorchShim`: Thinc's `PyTorchShim`, but its optimizer step writes into the parameters in place (Thinc's replaces each
  parameter's tensor, which takes an `nn.LSTM`'s weights out of the one flat block cuDNN reads: torch then warns and
  compacts them at every call), and its state is saved as msgpack arrays, never as a pickle.
- `padded_module`: a torch module over `Padded` (T, B, n) sequences as a Thinc layer, with `TorchShim`;
  `task_bilstm`, the task models' biLSTM.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import srsly
import torch
from thinc.api import ArgsKwargs, Model, Ops, PyTorchShim, get_torch_default_device
from thinc.layers.pytorchwrapper import forward as pytorch_forward
from thinc.types import Padded

# The start of a torch.save file (a zip archive): how Thinc's PyTorchShim saved a module's state.
TORCH_SAVE_MAGIC = b"PK\x03\x04"


def to_torch(array: Any, requires_grad: bool = False) -> torch.Tensor:
    """A NumPy or CuPy array as a torch tensor on its device, sharing its memory (a leaf with `requires_grad`)."""
    tensor = torch.from_numpy(array) if isinstance(array, np.ndarray) else torch.from_dlpack(array)
    return tensor.requires_grad_() if requires_grad else tensor


def to_xp(tensor: torch.Tensor, ops: Ops) -> Any:
    """A torch tensor as an array of `ops` (NumPy, or CuPy on a GPU), sharing its memory where devices allow."""
    tensor = tensor.detach()
    if ops.xp is np:
        return tensor.cpu().numpy()
    return ops.xp.from_dlpack(tensor.contiguous())


class TorchShim(PyTorchShim):
    """`PyTorchShim` with in-place optimizer steps and msgpack state (see the module)."""

    def finish_update(self, optimizer: Any) -> None:
        for name, parameter in self._model.named_parameters():
            if parameter.grad is None:
                continue
            if not self._grad_scaler.found_inf:  # no step after an overflow of the scaled gradients
                array, _ = optimizer((self.id, name), _array(parameter.data), _array(parameter.grad))
                # Into the parameter's own memory, through `.data` as Thinc's step: autograd does not count it as a
                # change (spaCy steps an upstream component before its listeners have backpropagated through it).
                parameter.data.copy_(to_torch(array).to(parameter.device))
            parameter.grad.zero_()
        self._grad_scaler.update()

    def to_bytes(self) -> bytes:
        """The module's config (`_config_to_save`) and its tensors as msgpack arrays; never a pickle."""
        state = None if self._model is None else srsly.msgpack_dumps(
            {name: tensor.detach().cpu().numpy() for name, tensor in self._model.state_dict().items()})
        return srsly.msgpack_dumps({"config": self._config_to_save(), "state": state})

    def from_bytes(self, bytes_data: bytes) -> TorchShim:
        msg = srsly.msgpack_loads(bytes_data)
        self._restore_config(msg["config"])
        if self._model is None:
            return self
        device = get_torch_default_device()
        self._model.load_state_dict(_saved_state(msg["state"], device))
        self._model.to(device)
        self._grad_scaler.to_(device)
        return self

    def _config_to_save(self) -> Any:
        """What `from_bytes` needs before the tensors: Thinc's `cfg`."""
        return self.cfg

    def _restore_config(self, config: Any) -> None:
        self.cfg = config


def _saved_state(state: bytes | dict, device: torch.device) -> dict[str, torch.Tensor]:
    """A module's tensors as `TorchShim.to_bytes` writes them (msgpack arrays), as the first pipelines of the biLM
    wrote them (the arrays' dict itself), or as Thinc's `PyTorchShim` did (torch.save, read by torch's weights-only
    loader: tensors and nothing else, no code run)."""
    if isinstance(state, bytes) and state[:4] == TORCH_SAVE_MAGIC:
        return torch.load(io.BytesIO(state), map_location=device, weights_only=True)
    arrays = srsly.msgpack_loads(state) if isinstance(state, bytes) else state
    return {name: torch.from_numpy(np.array(array)) for name, array in arrays.items()}


def _array(tensor: torch.Tensor) -> Any:
    """A parameter (or its gradient) as the optimizer's array type: NumPy on the CPU, CuPy on a GPU."""
    if tensor.device.type == "cpu":
        return tensor.numpy()
    import cupy

    return cupy.from_dlpack(tensor)


def padded_module(module: torch.nn.Module, with_lengths: bool = False) -> Model[Padded, Padded]:
    """`module` as a Thinc layer on `Padded` sequences: it is called with the (T, B, n) data and, with `with_lengths`,
    the lengths (a CPU tensor, where packing needs them; else None, as an `nn.LSTM`'s initial state) and returns
    (T, B, width) or a tuple starting with it."""
    return Model("pytorch", pytorch_forward, shims=[TorchShim(module)], dims={"nI": None, "nO": None},
                 attrs={"convert_inputs": _padded_to_torch, "convert_outputs": _torch_to_padded,
                        "with_lengths": with_lengths})


def _padded_to_torch(model: Model, Xp: Padded, is_train: bool) -> tuple[ArgsKwargs, Callable[[ArgsKwargs], Padded]]:
    data = to_torch(Xp.data).to(model.shims[0].device).requires_grad_(is_train)
    lengths = torch.from_numpy(model.ops.to_numpy(Xp.lengths).astype("int64")) if model.attrs["with_lengths"] else None

    def backprop(d_inputs: ArgsKwargs) -> Padded:
        return Padded(to_xp(d_inputs.args[0], model.ops), Xp.size_at_t, Xp.lengths, Xp.indices)

    return ArgsKwargs(args=(data, lengths), kwargs={}), backprop


def _torch_to_padded(
    model: Model, inputs_outputs: tuple[Padded, Any], is_train: bool
) -> tuple[Padded, Callable[[Padded], ArgsKwargs]]:
    Xp, output = inputs_outputs
    Ytorch = output[0] if isinstance(output, tuple) else output

    def backprop(dYp: Padded) -> ArgsKwargs:
        d_Ytorch = to_torch(dYp.data).to(Ytorch.device).reshape(Ytorch.shape)  # an empty batch: (0, 0, 0)
        return ArgsKwargs(args=((Ytorch,),), kwargs={"grad_tensors": (d_Ytorch,)})

    return Padded(to_xp(Ytorch, model.ops), Xp.size_at_t, Xp.lengths, Xp.indices), backprop


def task_bilstm(width: int, input_width: int, depth: int = 1, dropout: float = 0.0) -> Model[Padded, Padded]:
    """A task model's biLSTM over padded sequences: Thinc's `PyTorchLSTM(width, input_width, bi=True)` (the same
    module, layer and saved structure) on `TorchShim`."""
    model = padded_module(torch.nn.LSTM(input_width, width // 2, depth, bidirectional=True, dropout=dropout))
    model.set_dim("nO", width)
    model.set_dim("nI", input_width)
    return model
