"""What every example shares: arguments, the trees, timing, and the report."""
import argparse
import os
import time

import numpy as np

import recjit as rj

SST_TEST = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "sst", "test.txt")


def arguments(description, hidden):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--hidden", type=int, default=hidden, help="hidden size")
    parser.add_argument("--batch", type=int, default=10, help="trees per batch")
    parser.add_argument("--trees", default=None,
                        help="SST trees in PTB format (default: a generated sample)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    return parser.parse_args()


def load_trees(path, batch):
    """The first `batch` trees of a PTB file, or a generated sample of SST-like trees."""
    if path is None:
        return rj.Forest.random_binary(batch, seed=0), "generated sample"
    with open(path) as handle:
        lines = [line for _, line in zip(range(batch), handle)]
    return rj.Forest.from_ptb(lines), path


def median_ms(function, repeat):
    """Median latency in ms over `repeat` calls, after one warm-up call."""
    function()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def report(model, forest, params, source):
    """Run compiled and reference, print max error and both latencies."""
    start = time.perf_counter()
    compiled = model.run(forest, params)
    compile_s = time.perf_counter() - start
    reference = model.reference(forest, params)
    error = max(float(np.max(np.abs(a - b) / (1 + np.abs(b))))
                for a, b in zip(compiled.nodes, reference.nodes))
    compiled_ms = median_ms(lambda: model.run(forest, params), 30)
    reference_ms = median_ms(lambda: model.reference(forest, params), 3)
    print(f"{model.__name__} on {forest.roots.size} trees, {forest.num_nodes} nodes ({source})")
    print(f"  first run (compile + run): {compile_s:.2f} s")
    print(f"  max error vs reference:    {error:.2e} (|a - b| / (1 + |b|))")
    print(f"  recjit cpu:                {compiled_ms:.3f} ms")
    print(f"  reference recursion:       {reference_ms:.3f} ms  "
          f"({reference_ms / compiled_ms:.1f}x slower)")
    return error


def main(model, make_params, doc, hidden=256):
    """An example's command line: parse, load the trees, make parameters, report."""
    args = arguments(doc.splitlines()[0], hidden)
    forest, source = load_trees(args.trees, args.batch)
    vocab_size = int(forest.fields["word"].max()) + 1
    return report(model, forest, make_params(args.hidden, vocab_size, args.dtype), source)
