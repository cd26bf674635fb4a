"""The Python a CUDA `model.run` spends on the host, without a GPU: the run goes through numba's
simulator with the launch, the upload and the copy back stubbed out, so only recjit's own host
work is timed (signature, linearization, arguments, buffers, result). Most of a small forest's
latency on a GPU is host time; this measures changes to it on any machine. The simulator's
device arrays are not numba-cuda's, so reads of their attributes cost differently.

    NUMBA_ENABLE_CUDASIM=1 python tools/host_path.py [--models tree_fc,tree_lstm] [--batch 1]
        [--trees ../shared/data/sst/test.txt] [--runs 3000] [--prepared]

Prints the 5th percentile and the median of a run in microseconds: on a shared, noisy machine
the 5th percentile is the steadier of the two; compare changes in alternating processes."""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
import bench
from gpu_profile import bench_case

from recjit.codegen_cuda import CudaKernel, device


def stub_the_device():
    """Runs do all their host work and none of the device's."""
    CudaKernel.launch_all = lambda self, arguments: None
    device.Copies.queue_to_device = lambda self: None
    device.Copies.to_host = lambda self, begin, nbytes: None


def host_microseconds(name, batch, trees, runs, prepared=False):
    """(5th percentile, median) of a run's host work at the model's small hidden size; with
    `prepared`, of a run of the forest prepared ahead (`model.prepare`)."""
    hidden = next(b for b in bench.ZOO if b.name == name).hidden[0]
    model, forest, p = bench_case(name, hidden, batch, trees)
    if prepared:
        forest = model.prepare(forest, p, backend="cuda")
    model.run(forest, p, backend="cuda")
    for _ in range(runs // 10):
        model.run(forest, p, backend="cuda")
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        model.run(forest, p, backend="cuda")
        seconds.append(time.perf_counter() - start)
    return 1e6 * np.percentile(seconds, 5), 1e6 * np.median(seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tree_fc,tree_lstm")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--trees", default=None, help="SST trees in PTB format")
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--prepared", action="store_true",
                        help="time runs of forests prepared ahead (`model.prepare`)")
    args = parser.parse_args()
    if not device.simulated():
        parser.error("run it in numba's simulator: NUMBA_ENABLE_CUDASIM=1")
    stub_the_device()
    trees = None
    if args.trees:
        with open(args.trees) as handle:
            trees = [line for line in handle if line.strip()]
    for name in args.models.split(","):
        fifth, median = host_microseconds(name, args.batch, trees, args.runs, args.prepared)
        print(f"{name} b{args.batch}{' prepared' if args.prepared else ''}: host {fifth:.1f} "
              f"us (5th percentile), {median:.1f} us (median)")


if __name__ == "__main__":
    main()
