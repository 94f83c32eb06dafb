"""`ElmoInferenceCache`: what inference may keep between calls of a biLM, explicit and thread-safe.

One of the Hub remote code's files (`hub.REMOTE_CODE`).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import torch

from .configuration_elmo import integer_problem


def weights_state(parameters: Sequence[torch.Tensor]) -> tuple:
    """What identifies the values of `parameters` without reading them: in-place updates bump `_version`,
    optimizers that assign `.data` (e.g. Thinc's) change the address."""
    return tuple((p.data_ptr(), p._version, p.dtype, p.device, p.shape) for p in parameters)


class ElmoInferenceCache:
    """What inference may keep between calls of a biLM; pass it as `model(..., inference_cache=cache)`.

    - token representations (char CNN, highway, projection) of the `token_cache_size` most recently seen distinct
      words (0: none), so frequent words skip the char CNN. Used only for calls without gradient through the char
      CNN; emptied whenever a char-CNN weight, the device, the dtype, the autocast setting or the int8 mode changes.
    - forms of the weights the kernels read faster than the parameters themselves (`derived`: packed for oneDNN,
      transposed, cast to an autocast dtype, in int8, cuDNN's flat layout), made once and again whenever a weight
      changes.

    Changes the weights' version counters and addresses show are followed; after changes made outside torch (e.g.
    through a NumPy view of their memory) call `clear()`. Thread-safe: callers in several threads may share one
    cache (lookups and updates under a lock, the computation outside it). One cache per model keeps it small;
    copies and pickles of a cache are empty.
    """

    def __init__(self, token_cache_size: int = 20_000):
        if problem := integer_problem(token_cache_size, 0):
            raise ValueError(f"token_cache_size {problem}")
        self.token_cache_size = token_cache_size
        self._lock = threading.Lock()
        self._tokens: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._tokens_state: tuple = ()
        # (id(weight), form) → (a weak reference to the weight, the state of the weights it was made from, the form)
        self._forms: dict[tuple[int, Hashable], tuple[weakref.ref, tuple, object]] = {}

    def __len__(self) -> int:
        """Words whose token representation is cached."""
        return len(self._tokens)

    def __getstate__(self) -> dict:
        return {"token_cache_size": self.token_cache_size}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["token_cache_size"])

    def clear(self) -> None:
        """Forget every cached token representation and weight form (also frees their memory)."""
        with self._lock:
            self._tokens.clear()
            self._forms.clear()

    def token_representations(
        self,
        char_ids: torch.Tensor,
        parameters: Sequence[torch.Tensor],
        embed: Callable[[torch.Tensor], torch.Tensor],
        int8: bool = False,
    ) -> torch.Tensor:
        """(words, chars) distinct words' ids → `embed(ids)` (words, width), reading and filling the cache;
        `parameters` are those `embed` depends on, `int8` whether it computes in the int8 mode."""
        if self.token_cache_size == 0 or not len(char_ids):
            return embed(char_ids)
        device = char_ids.device.type
        autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        state = (autocast, int8, weights_state(parameters))
        keys = [row.tobytes() for row in char_ids.cpu().numpy()]
        with self._lock:
            if state != self._tokens_state:
                self._tokens.clear()
                self._tokens_state = state
            found = {key: self._tokens[key] for key in keys if key in self._tokens}
        missing = [i for i, key in enumerate(keys) if key not in found]
        if missing:
            found.update((keys[i], vector.clone()) for i, vector in zip(missing, embed(char_ids[missing])))
        with self._lock:
            if state == self._tokens_state:  # not if the weights changed meanwhile
                for key in keys:  # most recently used last (other threads may have evicted some meanwhile)
                    self._tokens[key] = found[key]
                    self._tokens.move_to_end(key)
                while len(self._tokens) > self.token_cache_size:
                    self._tokens.popitem(last=False)
        return torch.stack([found[key] for key in keys])

    def derived(self, weights: Sequence[torch.Tensor], form: Hashable, make: Callable[[], object]) -> object:
        """`make()`, a `form` of `weights[0]` (made from `weights`), made once and again whenever any of `weights`
        changes."""
        state = weights_state(weights)
        key = (id(weights[0]), form)
        with self._lock:
            entry = self._forms.get(key)
        if entry is None or entry[0]() is not weights[0] or entry[1] != state:
            entry = (weakref.ref(weights[0]), state, make())
            with self._lock:
                self._forms[key] = entry
        return entry[2]
