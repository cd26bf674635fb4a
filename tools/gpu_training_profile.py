"""Where a GPU training step spends its time: `bench_training.py`'s `RecjitCudaStep` (child-sum
TreeLSTM, X=H=256 unless told, SST train trees), each of its phases synchronized and timed, the
kernels' share of the forward and the pullback (CUDA events around each cooperative launch),
the device calls each phase makes (allocations, copies, launches), and the host's share by
function (cProfile, recjit's and the benchmark's functions by cumulative time). Each of
`--schedules` (`gpu_schedules.py`'s variants) in turn. Runs in numba's simulator too
(NUMBA_ENABLE_CUDASIM=1), where only the counts mean anything.

    python tools/gpu_training_profile.py [--data .gpu] [--batches 1,10,25] [--hidden 256]
                                         [--schedules default,staged]"""
import argparse
import cProfile
import functools
import os
import pstats
import sys
from collections import Counter

import numpy as np
from numba import cuda

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
import bench_training  # noqa: E402
from bench_training import LR, RecjitCudaStep, sst_batches, sst_lines  # noqa: E402
from gpu_profile import Laps  # noqa: E402
from gpu_schedules import SCHEDULES  # noqa: E402
from train_sst import initial_parameters  # noqa: E402

from recjit.codegen_cuda import device, runtime  # noqa: E402

PHASES = ("vjp (forward)", "loss (host)", "pullback", "adagrad")


# The runtime's small kernels a step may launch through numba's dispatcher: the GPU fields'
# and the parameter check's gathers, the check's comparisons, the device gradients' sums.
RUNTIME_KERNELS = ("gather_rows", "rows_differ", "add_into")


class LaunchCount:
    """A numba kernel whose launches (`kernel[grid, threads](...)`) are counted."""

    def __init__(self, kernel, count):
        self.kernel, self.count = kernel, count

    def __getitem__(self, configuration):
        self.count()
        return self.kernel[configuration]


class DeviceCalls:
    """Counts, by name, the calls of the device functions a step goes through: recjit's own
    (`codegen_cuda.device`), the runtime's small kernels, and numba's copies and uploads that
    the benchmark's step makes."""

    def __init__(self):
        self.counts = Counter()
        array_type = type(cuda.device_array(1))
        self.patched = [(device, name) for name in
                        ("to_device", "device_array", "pinned_array", "synchronize")]
        self.patched += [(device.Copies, "queue_to_device"), (device.Copies, "to_host"),
                         (device.CooperativeLaunch, "__call__"), (array_type, "copy_to_host"),
                         (cuda, "to_device")]
        for owner, name in self.patched:
            setattr(owner, name, self.counted(owner, name, getattr(owner, name)))
        for name in RUNTIME_KERNELS:
            label = f"runtime.{name} launch"
            setattr(runtime, name, LaunchCount(getattr(runtime, name),
                                               lambda label=label: self.counts.update((label,))))

    def counted(self, owner, name, function):
        label = f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"

        @functools.wraps(function)
        def call(*args, **kwargs):
            self.counts[label] += 1
            return function(*args, **kwargs)
        return call

    def take(self):
        counts, self.counts = self.counts, Counter()
        return counts


class KernelTimes:
    """CUDA events around every cooperative launch (a fused kernel: the forward's, the
    backward's), on the stream it is queued on, so that a phase's kernel time can be told from
    its host time."""

    def __init__(self):
        self.pending = []
        launch = device.CooperativeLaunch.__call__

        @functools.wraps(launch)
        def timed(kernel, blocks, arguments):
            start, end = cuda.event(), cuda.event()
            start.record()
            launch(kernel, blocks, arguments)
            end.record()
            self.pending.append((start, end))
        device.CooperativeLaunch.__call__ = timed

    def take(self):
        """The ms the launches since the last take ran on the device."""
        cuda.synchronize()
        elapsed = sum(start.elapsed_time(end) for start, end in self.pending)
        self.pending = []
        return elapsed


def phased_step(step, forest, laps, kernels, kernel_times):
    """`RecjitCudaStep.__call__`, synchronized and timed after each of its PHASES, and the
    kernels' time of the forward and the pullback into `kernels`."""
    lap = Laps(laps)
    out, pullback = bench_training.child_sum_tree_lstm.vjp(forest, step.cell_params(),
                                                           backend="cuda",
                                                           schedule=step.schedule)
    lap("vjp (forward)")
    kernels["forward's kernel"].append(kernel_times.take())
    h = out.nodes[0]
    _, probabilities = step.loss(forest, h)
    lap("loss (host)")
    gradients = pullback(nodes=(probabilities @ step.W_out, None),
                         device_output=step.DEVICE_OUTPUT)
    lap("pullback")
    kernels["backward's kernel"].append(kernel_times.take())
    step.adagrad(step.W_out, step.squares_out[0], probabilities.T @ h, LR)
    step.adagrad(step.b_out, step.squares_out[1], probabilities.sum(axis=0), LR)
    step.update_cell(gradients.params)
    lap("adagrad")


def profile(batches, hidden, vocab, steps, calls, kernel_times, schedule="default"):
    initial = initial_parameters(len(vocab), hidden, hidden, seed=0)
    step = RecjitCudaStep(initial, SCHEDULES[schedule])
    step(batches[0])  # compiles
    laps = {phase: [] for phase in PHASES}
    kernels = {"forward's kernel": [], "backward's kernel": []}
    calls.take()
    kernel_times.take()
    for forest in (batches * steps)[:steps]:
        phased_step(step, forest, laps, kernels, kernel_times)
    counts = calls.take()
    nodes = int(np.median([forest.num_nodes for forest in batches]))
    print(f"\n## {schedule}: batches of {len(batches[0].roots)} trees (median {nodes} nodes), "
          f"X=H={hidden}, {steps} steps: median ms a phase, "
          + ", ".join(f"{phase} {np.median(times):.3f}" for phase, times in laps.items())
          + f"; the whole step {np.median(np.sum(list(laps.values()), axis=0)):.3f}")
    print("of which on the device (events around the launches): " + ", ".join(
        f"{name} {np.median(times):.3f}" for name, times in kernels.items()))
    print("device calls a step: " + ", ".join(
        f"{name} {count / steps:g}" for name, count in sorted(counts.items())), flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    for forest in (batches * steps)[:steps]:
        step(forest)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats("recjit|bench_training", 25)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=".gpu")
    parser.add_argument("--batches", default="1,10,25", help="trees a batch, comma-separated")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--schedules", default="default", help=f"of {', '.join(SCHEDULES)}")
    args = parser.parse_args()
    calls = DeviceCalls()
    kernel_times = KernelTimes()
    vocab = {}
    for size in map(int, args.batches.split(",")):
        lines = sst_lines(os.path.join(args.data, "train.txt"), 4 * size)
        for schedule in args.schedules.split(","):
            profile(sst_batches(lines, size, vocab), args.hidden, vocab, args.steps, calls,
                    kernel_times, schedule)


if __name__ == "__main__":
    main()
