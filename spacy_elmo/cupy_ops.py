"""thinc's CuPy ops without the scatter CuPy deprecates.

thinc 8.3's `CupyOps.scatter_add` calls `cupyx.scatter_add`, which CuPy 12 and later deprecate in favour of
`cupy.add.at`: on a GPU every call warns, about 120 times per step of `spacy train` on the NER config (hash
embeddings' and the parser's gradients). `AddAtCupyOps` is `CupyOps` with thinc's own `Ops.scatter_add`, the same
`add.at` NumPy uses. The shipped configs select it with `[nlp] before_creation` (`spacy-elmo.CupyAddAt.v1`), so every
model of the pipeline holds it; it changes nothing on a CPU.

Remove it (and the configs' `before_creation`) once thinc's `CupyOps.scatter_add` calls `cupy.add.at` itself.
"""

from __future__ import annotations

from collections.abc import Callable

from spacy.language import Language
from spacy.util import registry
from thinc.api import CupyOps, Ops, get_current_ops, set_current_ops


class AddAtCupyOps(CupyOps):
    """`CupyOps` whose `scatter_add` is `cupy.add.at` (`Ops.scatter_add`): the same sums, without the deprecated
    `cupyx.scatter_add`."""

    scatter_add = Ops.scatter_add


@registry.callbacks("spacy-elmo.CupyAddAt.v1")
def configure_cupy_add_at() -> Callable[[type[Language]], type[Language]]:
    """`[nlp] before_creation`: when thinc runs on CuPy (`spacy train --gpu-id N`, `spacy.require_gpu()`), its ops
    become `AddAtCupyOps` on the same device before the pipeline's models are made."""

    def use_add_at(lang_class: type[Language]) -> type[Language]:
        ops = get_current_ops()
        if type(ops) is CupyOps:
            set_current_ops(AddAtCupyOps(device_id=ops.device_id))
        return lang_class

    return use_add_at
