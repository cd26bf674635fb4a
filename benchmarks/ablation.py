"""Ablation of recjit's scheduling primitives (Cortex Fig. 10).

    python benchmarks/ablation.py [--quick] [--cuda | --no-cuda] [--models tree_lstm,...]

(a) every model of the zoo, with the optimizations added one at a time, from a kernel that
    runs one node at a time, unspecialized, with nothing hoisted (and on the GPU unfused and
    without persistence, split units or staged products) up to the compiler's own schedule;
(b) recursion unrolling on TreeLSTM and TreeRNN;
(c) recursive refactoring on TreeGRU and SimpleTreeGRU.

Every schedule's result is checked against the naive recursion before it is timed; the
schedules of one panel are timed in turns (a run of each, then again), and each figure is the
median of its runs. results/ablation-<machine>.{json,md,png}."""
import argparse
import importlib
import json
import os
import time

import numpy as np
from bench import (HERE, TOLERANCE, ZOO, add_common_arguments, batches, remove_partial, setup,
                   write_partial, write_results)

import recjit as rj

BASE = rj.Schedule(dynamic_batching=False, specialize=False, hoist=False, fusion=False,
                   persistence=False, split_units=False, stage_products=False, row_groups=False,
                   block_packs=False, shared_tiles=False, node_ranges=False, refactor=False)
# (label, the fields it switches on); each step keeps the ones before it.
STEPS = [("base", {}), ("+ dynamic batching", {"dynamic_batching": True}),
         ("+ specialization", {"specialize": True}), ("+ hoisting", {"hoist": True})]
GPU_STEPS = [("+ fusion", {"fusion": True}), ("+ persistence", {"persistence": True}),
             ("+ split units", {"split_units": True}),
             ("+ staged products", {"stage_products": True}),
             ("+ row groups", {"row_groups": True}),
             ("+ block packs", {"block_packs": True}),
             ("+ shared tiles", {"shared_tiles": True}),
             ("+ node ranges", {"node_ranges": True})]
UNROLL_MODELS, UNROLL_DEPTHS = ("tree_lstm", "tree_rnn"), (1, 2, 3, 4)
REFACTOR_MODELS = ("tree_gru", "simple_tree_gru")


def model_and_params(benchmark, hidden, forests):
    """The model and float32 parameters for a vocabulary that covers the forests' words."""
    module = importlib.import_module(benchmark.name)
    vocab_size = max(int(f.fields["word"].max()) + 1 for f in forests) \
        if "word" in forests[0].fields else 1
    return getattr(module, benchmark.name), module.make_params(hidden, vocab_size, "float32")


def timed(model, forests, p, entries, repeat):
    """[(backend, label, median ms)] for `entries` [(backend, label, schedule)]: each checked
    against the reference first, then timed in turns, one run of each schedule after another,
    so that a burst of load on this shared machine hits every schedule alike."""
    on_device = p.to_device() if any(backend == "cuda" for backend, _, _ in entries) else None
    expected = model.reference(forests[0], p)
    runs = []
    for backend, _, schedule in entries:
        weights = on_device if backend == "cuda" else p
        for got, want in zip(model.run(forests[0], weights, backend, schedule).nodes,
                             expected.nodes):
            np.testing.assert_allclose(got, want, err_msg=f"{model.__name__} {schedule}",
                                       **TOLERANCE)
        runs.append(lambda f, w=weights, b=backend, s=schedule: model.run(f, w, b, s))
    times = [[] for _ in entries]
    for forest in forests * repeat:
        for run, samples in zip(runs, times):
            start = time.perf_counter()
            run(forest)
            samples.append(time.perf_counter() - start)
    return [(backend, label, 1e3 * float(np.median(samples)))
            for (backend, label, _), samples in zip(entries, times)]


def fig_a(benchmark, hidden, forests, repeat, backends):
    model, p = model_and_params(benchmark, hidden, forests)
    entries = []
    for backend in backends:
        schedule = BASE
        for label, fields in STEPS + (GPU_STEPS if backend == "cuda" else []):
            schedule = schedule.but(**fields)
            entries.append((backend, label, schedule))
        chosen = model.compile(forests[0], p, backend, rj.Schedule()).schedule
        staging = ", unstaged" if backend == "cuda" and not chosen.stage_products else ""
        entries.append((backend, f"the default (refactor={chosen.refactor}{staging})",
                        rj.Schedule()))
    return timed(model, forests, p, entries, repeat)


def fig_b(benchmark, hidden, forests, repeat, backends):
    model, p = model_and_params(benchmark, hidden, forests)
    return timed(model, forests, p, [(backend, f"unroll={depth}", rj.Schedule(
        unroll=depth, refactor=False)) for backend in backends for depth in UNROLL_DEPTHS],
        repeat)


def fig_c(benchmark, hidden, forests, repeat, backends):
    model, p = model_and_params(benchmark, hidden, forests)
    return timed(model, forests, p, [(backend, f"refactor={refactor}", rj.Schedule(
        refactor=refactor)) for backend in backends for refactor in (False, True)], repeat)


def markdown(results):
    gpu = results["gpu"]["name"] if results["gpu"] else "none"
    lines = [f"# recjit ablation on {results['machine']}", "",
             (f"{results['cpu']}; {json.dumps(results['versions'])}; GPU: {gpu}. Medians of "
              "one run, ms per batch of trees; each schedule checked against the naive "
              "recursion first, the schedules of a panel timed in turns."), ""]
    for figure, title in (("a", "optimizations added one at a time"),
                          ("b", "recursion unrolling"), ("c", "recursive refactoring")):
        rows = [row for row in results["rows"] if row["figure"] == figure]
        if not rows:
            continue
        lines += [f"## ({figure}) {title}", "",
                  "| model | hidden | batch | backend | schedule | ms |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['hidden']} | {r['batch']} | {r['backend']} | "
                  f"{r['schedule']} | {r['ms']:.3f} |" for r in rows]
        lines.append("")
    return "\n".join(lines)


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    groups = {}
    for row in results["rows"]:
        key = (row["figure"], row["model"], row["backend"], row["batch"])
        groups.setdefault(key, []).append(row)
    columns = 4
    count = len(groups)
    figure, axes = plt.subplots(-(-count // columns), columns, squeeze=False,
                                figsize=(14, 3.2 * -(-count // columns)))
    for axis, ((fig, model, backend, batch), rows) in zip(axes.flat, sorted(groups.items())):
        labels = [row["schedule"] for row in rows]
        axis.barh(range(len(rows)), [row["ms"] for row in rows], color=f"C{'abc'.index(fig)}")
        axis.set_yticks(range(len(rows)), labels, fontsize=6)
        axis.invert_yaxis()
        axis.set_title(f"({fig}) {model}, {backend}, batch {batch}", fontsize=8)
        axis.set_xlabel("ms per batch", fontsize=7)
        axis.tick_params(axis="x", labelsize=7)
    for axis in list(axes.flat)[count:]:
        axis.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="fewer forests per timing")
    args = parser.parse_args()
    header, trees = setup(parser, args)
    backends = ("cpu", "cuda") if header["gpu"] else ("cpu",)
    count, repeat = (2, 2) if args.quick else (5, 4)
    results = {**header, "rows": []}
    base = os.path.join(HERE, "results", f"ablation-{results['machine']}")
    wanted = args.models.split(",")
    for benchmark in ZOO:
        if benchmark.name not in wanted:
            continue
        hidden = benchmark.hidden[0]
        for batch in (1, 10):
            forests = batches(benchmark, trees, batch, count, hidden)
            figures = [("a", fig_a(benchmark, hidden, forests, repeat, backends))]
            if benchmark.name in UNROLL_MODELS:
                figures.append(("b", fig_b(benchmark, hidden, forests, repeat, backends)))
            if benchmark.name in REFACTOR_MODELS:
                figures.append(("c", fig_c(benchmark, hidden, forests, repeat, backends)))
            for figure, rows in figures:
                for backend, label, ms in rows:
                    results["rows"].append({"figure": figure, "model": benchmark.name,
                                            "hidden": hidden, "batch": batch,
                                            "backend": backend, "schedule": label, "ms": ms})
                    print(f"({figure}) {benchmark.name:>16} h{hidden:<4} b{batch:<3} {backend:4} "
                          f"{label:<44} {ms:9.3f} ms", flush=True)
                write_partial(base, results)
    write_results(base, results, markdown(results), plot)
    remove_partial(base)


if __name__ == "__main__":
    main()
