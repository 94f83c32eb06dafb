"""What one biLM LSTM step costs on this CPU, and the ceiling it puts on inference tokens/s.

    python benchmarks/bench_lstm_step.py --threads 2 [--presets small,original] [--rows 1,32,128]

The recurrence is the part of inference that cannot be batched over time: at each step both directions of a layer
multiply `rows` hidden states by the recurrent weight (4D × P) and, after the gate math, the cells by the projection
(P × D). For each preset, float32 (the default kernels of this CPU) and the bf16 mode (weights packed in bf16), and
each row count, it prints the time of one step of both directions as `ElmoLstmLayer.forward` runs it (matmuls and
gate math; input projections excluded: one matmul per window), the matmuls alone, the step weights' bytes and the
rate at which the step reads them, and the tokens/s that the two layers' recurrence alone would allow for batches of
`rows` sentences (each word costs one step of each layer: rows / (2 × step time)). Beside them: the machine's
streaming read rate (sum of a 1 GiB tensor) and its 2048² matmul peaks (`bench_training.matmul_flops_per_second`).
"""

from __future__ import annotations

import argparse

import torch
from bench_training import best_seconds, matmul_flops_per_second  # benchmarks/ (the script's directory)

from hf_elmo import ElmoConfig, ElmoInferenceCache, ElmoKernelOptions
from hf_elmo.formulas import lstm_cell
from hf_elmo.kernel_plan import KernelPlan
from hf_elmo.modeling_elmo import ElmoLstmLayer
from hf_elmo.runtime import cpu_name
from hf_elmo.weight_forms import both_directions


def read_bytes_per_second(mebibytes: int, repeats: int) -> float:
    """Streaming read rate: the sum of a float32 tensor of `mebibytes` (make it larger than the caches)."""
    data = torch.ones(mebibytes << 18)
    return data.numel() * 4 / best_seconds(data.sum, repeats, 1)


def step_timings(layer: ElmoLstmLayer, rows: int, bf16: bool, options: ElmoKernelOptions, repeats: int
                 ) -> tuple[float, float]:
    """Seconds of one step of both directions for `rows` rows: (whole step, its two matmuls alone)."""
    cell, hidden = layer.recurrent_weight.shape[1] // 4, layer.recurrent_weight.shape[2]
    # As in the step loop: under the bf16 mode h and the input projections (computed per window) are bf16, c float32.
    dtype = torch.bfloat16 if bf16 else torch.float32
    h, c = torch.randn(2, rows, hidden).to(dtype), torch.randn(2, rows, cell)
    step_input = list(torch.randn(2, rows, 4 * cell).to(dtype))
    weights = layer.weights()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        # The forms the step loop reads the weights in (packed, transposed), made as a forward's plan makes them.
        plan = KernelPlan.make(options, h, list(layer.parameters()), cache=ElmoInferenceCache(token_cache_size=0))
        _, packed_recurrent, packed_projection = plan.step_forms(weights, rows)
        recurrent_batched = plan.batched_step(rows, layer.recurrent_weight)
        projection_batched = plan.batched_step(rows, layer.projection_weight)

        def project(cells: torch.Tensor) -> torch.Tensor:
            return both_directions(cells, layer.projection_weight, packed_projection, plan.onednn, projection_batched)

        def step() -> None:
            gates = both_directions(h, layer.recurrent_weight, packed_recurrent, plan.onednn, recurrent_batched,
                                    step_input)
            lstm_cell(weights, gates, c, project)

        def matmuls() -> None:
            both_directions(h, layer.recurrent_weight, packed_recurrent, plan.onednn, recurrent_batched, step_input)
            both_directions(c, layer.projection_weight, packed_projection, plan.onednn, projection_batched)

        calls = max(10, 2000 // rows)
        return best_seconds(step, repeats, calls), best_seconds(matmuls, repeats, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--presets", default="small,original")
    parser.add_argument("--rows", default="1,32,128", help="rows per step (sentences per batch)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--read-mib", type=int, default=1024, help="size of the streaming read test")
    parser.add_argument("--peak-size", type=int, default=2048, help="size of the square matmuls of the peaks")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    options = ElmoKernelOptions()

    peaks = matmul_flops_per_second(args.peak_size)
    read = read_bytes_per_second(args.read_mib, args.repeats)
    print(f"machine: {cpu_name()}, torch {torch.__version__}, {args.threads} threads; streaming read "
          f"{read / 1e9:.1f} GB/s; {args.peak_size}² matmul peaks: float32 "
          f"{peaks['mkl'] / 1e9:.0f} GFLOP/s (MKL), {peaks['onednn'] / 1e9:.0f} (oneDNN), "
          f"bf16 {peaks['bf16'] / 1e9:.0f}")
    print(f"{'preset':<9} {'dtype':<8} {'rows':>5} {'step µs':>8} {'matmuls µs':>10} {'weights MB':>10} "
          f"{'read GB/s':>9} {'GFLOP/s':>8} {'tokens/s ceiling':>16}")
    for name in args.presets.split(","):
        torch.manual_seed(0)
        config = ElmoConfig.from_preset(name)
        layer = ElmoLstmLayer(config.projection_dim, config)
        for parameter in layer.parameters():
            torch.nn.init.normal_(parameter, std=0.02)
        weights = [layer.recurrent_weight, layer.projection_weight]
        elements = sum(w.numel() for w in weights if w is not None)  # both directions
        for bf16 in (False, True):
            megabytes = elements * (2 if bf16 else 4) / 1e6
            for rows in map(int, args.rows.split(",")):
                step, matmuls = step_timings(layer, rows, bf16, options, args.repeats)
                print(f"{name:<9} {'bf16' if bf16 else 'float32':<8} {rows:>5} {step * 1e6:>8.1f} "
                      f"{matmuls * 1e6:>10.1f} {megabytes:>10.2f} {megabytes / 1e3 / matmuls:>9.1f} "
                      f"{2 * rows * elements / matmuls / 1e9:>8.1f} {rows / (2 * step):>16.0f}", flush=True)


if __name__ == "__main__":
    main()
