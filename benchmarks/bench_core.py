"""The core measurements: linearization time, and compiled TreeLSTM against the reference.

    python benchmarks/bench_core.py [--trees ../shared/data/sst/test.txt] [--hidden 256]

Prints the figures and records them in benchmarks/results/core-<machine>.json. Timings are
medians after warm-up; this is a benchmark, never a test."""
import argparse
import json
import os
import platform
import sys
import time

import numba
import numpy as np

import recjit as rj
from recjit.linearize import linearize

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from common import median_ms  # noqa: E402
from tree_lstm import make_params, tree_lstm  # noqa: E402

DEFAULT_TREES = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "sst",
                             "test.txt")


def load(path):
    """The PTB lines of `path`, or None where it is absent (synthetic trees stand in)."""
    if path and os.path.exists(path):
        with open(path) as handle:
            return [line for line in handle if line.strip()], path
    return None, "synthetic"


def forest_of(lines, count):
    return rj.Forest.from_ptb(lines) if lines else rj.Forest.random_binary(count or 2210, seed=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=DEFAULT_TREES)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=10)
    args = parser.parse_args()

    lines, source = load(args.trees)
    batch = forest_of(lines[:args.batch] if lines else None, args.batch)
    everything = forest_of(lines, 0)
    figures = {"machine": platform.node(), "processor": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "python": platform.python_version(),
               "numpy": np.__version__, "numba": numba.__version__, "trees": source,
               "hidden": args.hidden, "batch": args.batch}

    figures["linearize_batch_us"] = 1e3 * median_ms(lambda: linearize(batch), 2000)
    figures["linearize_batch_nodes"] = batch.num_nodes
    figures["linearize_all_ms"] = median_ms(lambda: linearize(everything), 50)
    figures["linearize_all_trees"] = int(everything.roots.size)
    figures["linearize_all_nodes"] = everything.num_nodes

    vocab_size = int(everything.fields["word"].max()) + 1
    p = make_params(args.hidden, vocab_size, "float32")
    start = time.perf_counter()
    compiled = tree_lstm.run(batch, p)
    figures["tree_lstm_first_run_s"] = time.perf_counter() - start
    reference = tree_lstm.reference(batch, p)
    figures["tree_lstm_max_abs_error"] = max(float(np.abs(a - b).max())
                                             for a, b in zip(compiled.nodes, reference.nodes))
    figures["tree_lstm_cpu_ms"] = median_ms(lambda: tree_lstm.run(batch, p), 100)
    figures["tree_lstm_reference_ms"] = median_ms(lambda: tree_lstm.reference(batch, p), 10)
    figures["tree_lstm_speedup"] = figures["tree_lstm_reference_ms"] / figures["tree_lstm_cpu_ms"]

    print(f"trees: {source}")
    print(f"linearize {args.batch} trees ({batch.num_nodes} nodes): "
          f"{figures['linearize_batch_us']:.1f} us  (target <= 20 us)")
    print(f"linearize all {figures['linearize_all_trees']} trees "
          f"({figures['linearize_all_nodes']} nodes): {figures['linearize_all_ms']:.2f} ms  "
          f"(target <= 10 ms)")
    print(f"TreeLSTM hidden {args.hidden}, batch {args.batch}, float32:")
    print(f"  first run: {figures['tree_lstm_first_run_s']:.2f} s (numba compiles the kernel, "
          f"or loads it from its disk cache in later processes)")
    print(f"  recjit cpu {figures['tree_lstm_cpu_ms']:.3f} ms, reference "
          f"{figures['tree_lstm_reference_ms']:.3f} ms: {figures['tree_lstm_speedup']:.1f}x "
          f"(target >= 10x); max abs error {figures['tree_lstm_max_abs_error']:.1e}")
    path = os.path.join(os.path.dirname(__file__), "results", f"core-{platform.node()}.json")
    with open(path, "w") as handle:
        json.dump(figures, handle, indent=2)
    print(f"recorded in {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
