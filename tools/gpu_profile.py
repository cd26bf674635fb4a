"""Where a CUDA `model.run` spends its time on a real GPU: the whole call against the kernel
alone (timed with CUDA events), and the host's share by function (cProfile).

    python tools/gpu_profile.py [--trees .gpu/test.txt] [--models tree_fc,tree_lstm] [--threads 512]"""
import argparse
import cProfile
import importlib
import os
import pstats
import sys
import time

import numpy as np
from gpu_products import events_ms
from numba import cuda

import recjit as rj
from recjit.codegen_cuda import device

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
import bench


def bench_case(name, hidden, batch, trees):
    """(the model, the bench's first forest of `batch` trees for it, float32 parameters on the
    device covering the forest's words)."""
    benchmark = next(b for b in bench.ZOO if b.name == name)
    forest = bench.batches(benchmark, trees, batch, 1, hidden)[0]
    module = importlib.import_module(name)
    vocab = int(forest.fields["word"].max()) + 1 if "word" in forest.fields else 1
    return getattr(module, name), forest, module.make_params(hidden, vocab, "float32").to_device()


def profile(name, hidden, batch, trees, runs, schedule):
    model, forest, p = bench_case(name, hidden, batch, trees)
    model.run(forest, p, backend="cuda", schedule=schedule)
    prepared = model.prepare(forest, p, backend="cuda", schedule=schedule)
    linearized, inputs = prepared.linearized, prepared.inputs
    kernel = prepared.compiled.backend_kernel

    def whole():
        model.run(forest, p, backend="cuda", schedule=schedule)

    shapes = prepared.compiled.cell.state_shapes

    def launch_only():
        kernel.run(linearized, p, shapes, inputs)

    timings = {label: 1e3 * bench.median_seconds([call] * (runs + 1))
               for label, call in (("run", whole), ("kernel.run", launch_only))}
    timings["events around the call"] = events_ms(launch_only, runs)
    timings.update(pieces(kernel, linearized, inputs, p, shapes, runs))
    print(f"\n## {name} h{hidden} b{batch}, {kernel.threads} threads a block: "
          f"{linearized.num_nodes} nodes; "
          + ", ".join(f"{k} {v:.3f} ms" for k, v in timings.items()), flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        whole()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(10)


class Laps:
    """`laps(name)` adds to `times[name]` the ms since the last lap (or since it was made),
    once the device has run everything queued: a host step's time with its device work."""

    def __init__(self, times):
        self.times = times
        self.clock = time.perf_counter()

    def __call__(self, name):
        cuda.synchronize()
        now = time.perf_counter()
        self.times[name].append(1e3 * (now - self.clock))
        self.clock = now


def pieces(kernel, linearized, inputs, p, shapes, runs):
    """Median ms of each step of `CudaKernel.run`, synchronized after each, and of the
    launch alone between CUDA events. cProfile (above) breaks the host's steps down."""
    steps = {"arguments (forest upload, parameters, states, scratch)": [], "launch (host)": [],
             "launch (events)": [], "copy back": []}
    start, stop = cuda.event(), cuda.event()
    for _ in range(runs):
        lap = Laps(steps)
        arguments, states = kernel.prepare(linearized, p, inputs)
        lap("arguments (forest upload, parameters, states, scratch)")
        start.record()
        kernel.launch_all(arguments)
        stop.record()
        lap("launch (host)")
        steps["launch (events)"].append(start.elapsed_time(stop))
        kernel.result(states, shapes, linearized, device_output=False)
        lap("copy back")
    return {step: float(np.median(times)) for step, times in steps.items()}


def barrier_cost(runs):
    """ms of a cooperative launch, a block per multiprocessor, doing 0 and 100 grid syncs."""
    @cuda.jit
    def barriers(count, out):
        grid = cuda.cg.this_grid()
        for _ in range(count):
            grid.sync()
        if cuda.grid(1) == 0:
            out[0] = count

    out = cuda.device_array(1, np.int64)
    blocks = device.multiprocessors()
    for count in (0, 100):
        ms = events_ms(lambda count=count: barriers[blocks, 256](count, out), runs)
        print(f"## {count} grid syncs, {blocks} blocks x 256: {ms:.4f} ms", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=bench.DEFAULT_TREES)
    parser.add_argument("--models", default="tree_fc,tree_lstm")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None,
                        help="threads a block (Schedule(threads=...)); default: the backend's")
    args = parser.parse_args()
    schedule = rj.Schedule(threads=args.threads)
    with open(args.trees) as handle:
        trees = [line for line in handle if line.strip()]
    barrier_cost(args.runs)
    for name in args.models.split(","):
        hidden = next(b for b in bench.ZOO if b.name == name).hidden[0]
        for batch in (1, 10):
            profile(name, hidden, batch, trees, args.runs, schedule)


if __name__ == "__main__":
    main()
