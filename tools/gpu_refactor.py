"""Whether the compiler's choice of refactoring per forest (`lowering/choose.py`,
`RefactorTrade`) is right on this GPU: each model, hidden size and batch of the bench, timed
with the default schedule, refactored and unrefactored, in turns on the same forests, each
checked against the naive recursion first. The choice's rates were fitted on one model's two
points (TreeFC, h256); this is where they extrapolate.

    python tools/gpu_refactor.py [--trees .gpu/test.txt] [--models tree_lstm,tree_rnn]
                                 [--hidden 256,512] [--batches 1,10]"""
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

SCHEDULES = {"default": None, "refactored": rj.Schedule(refactor=True),
             "unrefactored": rj.Schedule(refactor=False)}


def measure(benchmark, hidden, batch, trees, count, rounds):
    """{schedule: median ms} and what the default chose, on `count` forests."""
    module = importlib.import_module(benchmark.name)
    model = getattr(module, benchmark.name)
    forests = bench.batches(benchmark, trees, batch, count, hidden)
    vocab_size = max(int(f.fields["word"].max()) + 1 for f in forests) \
        if "word" in forests[0].fields else 1
    p = module.make_params(hidden, vocab_size, "float32")
    on_device = p.to_device()
    runs_of = {}
    for label, schedule in SCHEDULES.items():
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
    parser.add_argument("--hidden", default="256,512")
    parser.add_argument("--batches", default="1,10")
    parser.add_argument("--count", type=int, default=8, help="forests per row")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    trees = None
    if os.path.exists(args.trees):
        with open(args.trees) as handle:
            trees = [line for line in handle if line.strip()]
    zoo = {b.name: b for b in bench.ZOO}
    print("| model | hidden | batch | default chose refactor | default ms | refactored ms "
          "| unrefactored ms |\n|---|---|---|---|---|---|---|", flush=True)
    for name in args.models.split(","):
        for hidden in map(int, args.hidden.split(",")):
            for batch in map(int, args.batches.split(",")):
                ms, chosen = measure(zoo[name], hidden, batch, trees, args.count, args.rounds)
                picks = sorted(set(chosen), key=str)
                print(f"| {name} | {hidden} | {batch} | {'/'.join(map(str, picks))} "
                      f"| {ms['default']:.3f} | {ms['refactored']:.3f} "
                      f"| {ms['unrefactored']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
