"""Arrays between Thinc (NumPy or CuPy) and torch, sharing memory: `torch.from_numpy` on the CPU, DLPack's protocol
(`torch.from_dlpack`, `cupy.from_dlpack`) on a GPU. Thinc's own `xp2torch` / `torch2xp` call CuPy's deprecated
`toDlpack` / `fromDlpack`, which warn at every call."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from thinc.api import Ops


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
