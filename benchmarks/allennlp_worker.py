"""Run AllenNLP 2.10.1's ELMo biLM on the inputs `bench_inference.py` prepared; runs in AllenNLP's own virtualenv.

    python allennlp_worker.py WORK_DIR THREADS REPEATS

WORK_DIR holds `options.json`, `weights.hdf5`, `batches.npz` (char ids without sentence boundaries, one array per
batch) and `single.npy` (one sentence); the worker writes `result.json` (seconds per pass over all batches, median
latency of the single sentence) and `layers.npz` (every layer of the first batch, boundaries included).
"""

import importlib.machinery
import json
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

# AllenNLP imports torchvision but never uses it for ELMo; the PyPI build does not load with CPU torch.
placeholder = types.ModuleType("torchvision")
placeholder.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
sys.modules.setdefault("torchvision", placeholder)

from allennlp.modules.elmo import _ElmoBiLm  # noqa: E402


def main() -> None:
    work_dir, threads, repeats = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    bilm = _ElmoBiLm(str(work_dir / "options.json"), str(work_dir / "weights.hdf5")).eval()
    archive = np.load(work_dir / "batches.npz")
    batches = [torch.from_numpy(archive[key]) for key in sorted(archive.files, key=int)]
    single = torch.from_numpy(np.load(work_dir / "single.npy"))
    with torch.no_grad():
        # The first batch from the fresh (zero) state: comparable with a stateless biLM.
        first = bilm(batches[0])
        np.savez(work_dir / "layers.npz", *[layer.numpy() for layer in first["activations"]])
        for batch in batches:  # warm-up
            bilm(batch)
        timings = []
        for _ in range(repeats):
            start = time.perf_counter()
            for batch in batches:
                bilm(batch)
            timings.append(time.perf_counter() - start)
        latencies = []
        for _ in range(repeats * 4):
            start = time.perf_counter()
            bilm(single)
            latencies.append(time.perf_counter() - start)
    result = {"seconds": statistics.median(timings), "latency": statistics.median(latencies)}
    (work_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
