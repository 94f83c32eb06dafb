"""How the biLM's callers live with the device they run on: what to do when a batch does not fit in its memory.

`elmo embed` / `ElmoEmbedder` and the spaCy component run the biLM on batches of sentences whose rows never depend on
each other, so a batch the GPU has no memory for can run in parts: `halve_on_out_of_memory` splits it in two, and
each half again as needed, with the outputs of a run that had the memory. A single sentence that does not fit is
`OutOfDeviceMemoryError`, one line that says which sentence and what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

Item = TypeVar("Item")
Result = TypeVar("Result")


class OutOfDeviceMemoryError(torch.cuda.OutOfMemoryError):
    """One sentence needs more memory than the device has, even alone."""


def halve_on_out_of_memory(
    items: Sequence[Item],
    run: Callable[[Sequence[Item]], Result],
    join: Callable[[list[Result]], Result],
    describe: Callable[[Item], str],
) -> Result:
    """`run(items)`; when the device runs out of memory, `join([run(first half), run(second half)])`, each half halved
    again as needed. `run` must give each item what it would give it in any batch (as the biLM does: every sentence
    starts from the zero state). One item that does not fit alone raises `OutOfDeviceMemoryError`, its message
    starting with `describe(item)`."""
    try:
        return run(items)
    except torch.cuda.OutOfMemoryError as error:
        if len(items) == 1:
            reason = str(error).split("\n", 1)[0].split(". ", 1)[0]
            raise OutOfDeviceMemoryError(
                f"{describe(items[0])} does not fit in the device's memory even alone ({reason}): embed long "
                "sentences as windows of fewer words (--max-sentence-words / max_sentence_words, or the spaCy span "
                "getter's max_length), run on a device with more memory, or on the CPU"
            ) from None
    # Here, out of the `except` block, the failed attempt's tensors are freed with its traceback.
    half = len(items) // 2
    return join([halve_on_out_of_memory(part, run, join, describe) for part in (items[:half], items[half:])])
