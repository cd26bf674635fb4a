"""How a fused CUDA kernel's time grows with the forest's depth, on a real GPU: one tree of
each depth (a leaf and a subtree under every internal node), the kernel timed alone. The
slope is what a batch costs, the intercept the launch and the hoisted phases.

Three clocks, since the events around one launch also count the host's time to submit it:
`events` (one launch between CUDA events), `queued` (20 launches back to back between
events, per launch: the kernel's own time when it is longer than a submission) and `host`
(the submission alone, no synchronization).

    python tools/gpu_levels.py [--models tree_lstm] [--depths 1,2,4,8,16,32,64] [--once]

--once launches each depth's kernel a single time after its compilation, for a profiler."""
import argparse
import importlib
import os
import sys
import time

import numpy as np
from gpu_products import events_ms
from gpu_schedules import SCHEDULES
from numba import cuda

import recjit as rj

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
import bench

QUEUED = 20


def comb(depth):
    """A PTB tree with `depth` internal nodes, each a leaf's parent and the next one's."""
    text = f"(0 w{depth})"
    for level in range(depth):
        text = f"(0 (0 w{level}) {text})"
    return text


def queued_ms(launch, repeats):
    """Per launch, of `QUEUED` launches back to back between two events."""
    def queued():
        for _ in range(QUEUED):
            launch()
    return events_ms(queued, repeats) / QUEUED


def host_ms(launch, repeats):
    times = []
    for _ in range(repeats):
        cuda.synchronize()
        clock = time.perf_counter()
        launch()
        times.append(1e3 * (time.perf_counter() - clock))
    cuda.synchronize()
    return float(np.median(times))


def measure(name, hidden, depths, schedule, runs, once):
    module = importlib.import_module(name)
    model = getattr(module, name)
    p = module.make_params(hidden, max(depths) + 1, "float32").to_device()
    rows = []
    for depth in depths:
        forest = rj.Forest.from_ptb([comb(depth)])
        model.run(forest, p, backend="cuda", schedule=schedule)
        if not once:
            rows.append(time_depth(model, forest, p, schedule, runs))
    return rows


def time_depth(model, forest, p, schedule, runs):
    """(depth, nodes, ms of model.run, of the launch between events, queued, on the host)."""
    prepared = model.prepare(forest, p, backend="cuda", schedule=schedule)
    kernel, linearized = prepared.compiled.backend_kernel, prepared.linearized
    arguments, _ = kernel.prepare(linearized, p, prepared.inputs)

    def launch():
        kernel.launch_all(arguments)

    run_ms = 1e3 * bench.median_seconds(
        [lambda: model.run(forest, p, backend="cuda", schedule=schedule)] * (runs + 1))
    depth = len(linearized.batch_begin) - 2
    return (depth, linearized.num_nodes, run_ms, events_ms(launch, runs),
            queued_ms(launch, max(runs // 5, 3)), host_ms(launch, runs))


def slope(rows, column):
    depths = np.array([row[0] for row in rows], dtype=float)
    values = np.array([row[column] for row in rows])
    per_level, intercept = np.polyfit(depths, values, 1)
    return 1e3 * per_level, intercept


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tree_lstm")
    parser.add_argument("--depths", default="1,2,4,8,16,32,64")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--variants", default="default",
                        help=f"comma-separated, of {', '.join(SCHEDULES)} (gridpacked: "
                        "staged, unrefactored, the grid packing)")
    parser.add_argument("--once", action="store_true")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    for name in args.models.split(","):
        hidden = next(b for b in bench.ZOO if b.name == name).hidden[0]
        for variant in args.variants.split(","):
            schedule = SCHEDULES[variant].but(threads=args.threads)
            rows = measure(name, hidden, depths, schedule, args.runs, args.once)
            if args.once:
                continue
            print(f"\n## {name} h{hidden} {variant}, threads {args.threads or 'default'} "
                  "(ms; depth = internal batches)")
            print("depth nodes    run  events  queued   host")
            for row in rows:
                print("{:5d} {:5d} {:6.3f} {:7.3f} {:7.3f} {:6.3f}".format(*row))
            for column, label in ((2, "run"), (3, "events"), (4, "queued")):
                per_level, intercept = slope(rows, column)
                print(f"{label}: {per_level:.2f} us a level + {intercept:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
