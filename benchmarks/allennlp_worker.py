"""Run AllenNLP 2.10.1's ELMo biLM on the inputs `bench_inference.py` prepared; runs in AllenNLP's own virtualenv.

    python allennlp_worker.py WORK_DIR THREADS REPEATS LATENCY_CALLS [DEVICE]

WORK_DIR holds `options.json`, `weights.hdf5`, `batches.npz` (char ids without sentence boundaries, one array per
batch) and `single.npy` (one sentence); the worker writes `result.json` (seconds per pass over all batches: median
of REPEATS; latency of the single sentence: median of LATENCY_CALLS after `LATENCY_WARM_UP` calls) and `layers.npz`
(every layer of the first batch, boundaries included).
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

LATENCY_WARM_UP = 5  # untimed single-sentence calls, as in bench_inference.py

from allennlp.modules.elmo import _ElmoBiLm  # noqa: E402


def main() -> None:
    work_dir, threads, repeats, latency_calls = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    device = torch.device(sys.argv[5] if len(sys.argv) > 5 else "cpu")
    torch.set_num_threads(threads)
    bilm = _ElmoBiLm(str(work_dir / "options.json"), str(work_dir / "weights.hdf5")).eval().to(device)
    archive = np.load(work_dir / "batches.npz")
    batches = [torch.from_numpy(archive[key]).to(device) for key in sorted(archive.files, key=int)]
    single = torch.from_numpy(np.load(work_dir / "single.npy")).to(device)

    def seconds(function) -> float:
        start = time.perf_counter()
        function()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    with torch.no_grad():
        # The first batch from the fresh (zero) state: comparable with a stateless biLM.
        first = bilm(batches[0])
        np.savez(work_dir / "layers.npz", *[layer.cpu().numpy() for layer in first["activations"]])
        for batch in batches:  # warm-up
            bilm(batch)
        timings = [seconds(lambda: [bilm(batch) for batch in batches]) for _ in range(repeats)]
        for _ in range(LATENCY_WARM_UP):
            bilm(single)
        latencies = [seconds(lambda: bilm(single)) for _ in range(latency_calls)]
    result = {"seconds": statistics.median(timings), "latency": statistics.median(latencies)}
    (work_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
