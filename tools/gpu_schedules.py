"""Whether the compiler's choices are right on this GPU: each model, hidden size and batch of
the bench, timed with the default schedule and its variants (refactored or not, without node
ranges, ...), in turns on the same forests, each checked against the naive recursion first.
The refactoring choice's rates (`lowering/choose.py`, `RefactorTrade`) were fitted on one
model's two points (TreeFC, h256), and the node ranges' balance (`codegen_cuda/ranges.py`)
on none: this is where they are tried.

    python tools/gpu_schedules.py [--trees .gpu/test.txt] [--models tree_lstm,tree_rnn]
                                  [--hidden 256,512] [--batches 1,10]
                                  [--schedules default,refactored,unrefactored]

The variants (`SCHEDULES`, also `gpu_levels.py`'s) each change one choice: unrefactored,
refactored, unpersistent, unsplit, ungrouped, unranged; staged (products staged through
shared memory, each block packing their inputs itself), gridpacked (staged, unrefactored,
the grid packing), unshared (staged, unrefactored, each packed product in tiles of its
own); blocks32 and blocks64 run a fused grid of that many blocks, not one a multiprocessor
(a cheaper grid barrier, fewer hands for a large batch)."""
import argparse
import importlib
import os
import sys

import numpy as np

import recjit as rj

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
import bench

# The default schedule and its variants, each without one of the compiler's choices
# (`benchmarks/README.md` says which GPU session measured which).
SCHEDULES = {"default": rj.Schedule(), "refactored": rj.Schedule(refactor=True),
             "unrefactored": rj.Schedule(refactor=False),
             "unpersistent": rj.Schedule(persistence=False),
             "unsplit": rj.Schedule(split_units=False),
             "staged": rj.Schedule(stage_products=True),
             "ungrouped": rj.Schedule(row_groups=False),
             "unranged": rj.Schedule(node_ranges=False),
             "gridpacked": rj.Schedule(stage_products=True, block_packs=False, refactor=False),
             "unshared": rj.Schedule(stage_products=True, shared_tiles=False, refactor=False),
             "blocks32": rj.Schedule(blocks=32), "blocks64": rj.Schedule(blocks=64)}


def measure(benchmark, hidden, batch, trees, count, rounds, schedules):
    """{schedule: median ms} and what the default chose to refactor, on `count` forests."""
    module = importlib.import_module(benchmark.name)
    model = getattr(module, benchmark.name)
    forests = bench.batches(benchmark, trees, batch, count, hidden)
    vocab_size = max(int(f.fields["word"].max()) + 1 for f in forests) \
        if "word" in forests[0].fields else 1
    p = module.make_params(hidden, vocab_size, "float32")
    on_device = p.to_device()
    runs_of = {}
    for label in schedules:
        schedule = SCHEDULES[label]
        runs = [lambda f=f, schedule=schedule: model.run(f, on_device, backend="cuda",
                                                          schedule=schedule).roots[0]
                for f in forests]
        for run, forest in zip(runs, forests):
            np.testing.assert_allclose(run(), model.reference(forest, p).roots[0],
                                       err_msg=f"{label} {benchmark.name}", **bench.TOLERANCE)
        runs_of[label] = runs
    chosen = [model.compile(f, on_device, backend="cuda").schedule.refactor for f in forests]
    return {label: 1e3 * s for label, s in bench.in_rounds(runs_of, rounds).items()}, chosen


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=".gpu/test.txt")
    parser.add_argument("--models", default="tree_fc,tree_rnn,tree_gru,tree_lstm")
    parser.add_argument("--hidden", default="256,512",
                        help="comma-separated sizes, or 'small': each model's smaller bench size "
                        "(MV-RNN's 64)")
    parser.add_argument("--batches", default="1,10")
    parser.add_argument("--schedules", default="default,refactored,unrefactored",
                        help=f"comma-separated, of {', '.join(SCHEDULES)}")
    parser.add_argument("--count", type=int, default=8, help="forests per row")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    schedules = args.schedules.split(",")
    trees = None
    if os.path.exists(args.trees):
        with open(args.trees) as handle:
            trees = [line for line in handle if line.strip()]
    zoo = {b.name: b for b in bench.ZOO}
    print("| model | hidden | batch | default chose refactor | "
          + " | ".join(f"{label} ms" for label in schedules) + " |\n"
          + "|---" * (4 + len(schedules)) + "|", flush=True)
    for name in args.models.split(","):
        sizes = ([zoo[name].hidden[0]] if args.hidden == "small"
                 else map(int, args.hidden.split(",")))
        for hidden in sizes:
            for batch in map(int, args.batches.split(",")):
                ms, chosen = measure(zoo[name], hidden, batch, trees, args.count, args.rounds,
                                     schedules)
                picks = sorted(set(chosen), key=str)
                print(f"| {name} | {hidden} | {batch} | {'/'.join(map(str, picks))} | "
                      + " | ".join(f"{ms[label]:.3f}" for label in schedules) + " |",
                      flush=True)


if __name__ == "__main__":
    main()
