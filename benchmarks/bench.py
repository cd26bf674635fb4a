"""The side-by-side benchmark (docs/design.md §8): every model of the zoo against the peers a user
would run instead, in one process, on the same parameters and inputs.

    python benchmarks/bench.py [--trees ../shared/data/sst/test.txt] [--quick]
                               [--models tree_lstm,...] [--machine NAME] [--cuda | --no-cuda]
    python benchmarks/bench.py --merge PART.json... --machine NAME

Every peer's roots are checked against the naive recursion before it is timed. Latency is the
median over batches after a warm-up batch; recjit's compile and linearization times are reported
apart. With a GPU (`--cuda`, the default where numba.cuda finds one), recjit's CUDA kernel and
PyTorch level-batched on the GPU run too, and the GPU targets are judged: Cortex's
latency against recjit's whole run and against its run of a forest prepared ahead (`recjit
cuda prepared`: `model.prepare` validates and linearizes outside the timer); the ratio to
PyTorch, which linearizes inside its timed run, against the whole run. Writes
benchmarks/results/<machine>.json, .md and .png (latency against hidden size).
This is a benchmark, never a test: nothing here asserts a timing."""
import argparse
import importlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass

import numba
import numpy as np
from numba.core.registry import cpu_target

import recjit as rj
from recjit.codegen_cpu import calls as cpu_calls
from recjit.codegen_cpu.runtime import VECTOR_BYTES
from recjit.linearize import distinct

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, HERE)
DEFAULT_TREES = os.path.join(HERE, "..", "..", "shared", "data", "sst", "test.txt")
PEER_MODULES = {"pytorch eager": ("peers.torch_peers", "EAGER"),
                "pytorch level-batched": ("peers.torch_peers", "LEVELS"),
                "dynet autobatch": ("peers.dynet_peers", "AUTOBATCH")}
GPU_PEERS = {"pytorch level-batched cuda": ("peers.torch_peers", "LEVELS_CUDA")}
# recjit's CUDA run of a forest prepared ahead: linearization timed apart (`linearize ms`).
PREPARED = "recjit cuda prepared"
# Cortex Table 5, V100, the smaller hidden size: ms at batch 1 and 10.
CORTEX_V100_MS = {"tree_fc": (0.08, 0.17), "dag_rnn": (0.22, 0.39), "tree_gru": (0.18, 0.35),
                  "tree_lstm": (0.24, 0.39), "mv_rnn": (0.34, 0.78)}
TOLERANCE = {"rtol": 2e-3, "atol": 2e-4}  # float32 peers, each with its own summation order
VOCAB = {}  # one vocabulary for every batch of SST trees


@dataclass(frozen=True)
class Benchmark:
    """A model of docs/design.md §7: its example module, its structure, its hidden sizes (hs,
    hl)."""

    name: str
    structure: str  # "sst", "perfect", "grid" or "sequence"
    hidden: tuple


ZOO = [Benchmark("tree_fc", "perfect", (256, 512)), Benchmark("tree_rnn", "sst", (256, 512)),
       Benchmark("dag_rnn", "grid", (256, 512)), Benchmark("tree_gru", "sst", (256, 512)),
       Benchmark("simple_tree_gru", "sst", (256, 512)),
       Benchmark("tree_lstm", "sst", (256, 512)), Benchmark("mv_rnn", "sst", (64, 128)),
       Benchmark("lstm", "sequence", (256,)), Benchmark("gru", "sequence", (256,))]


def batches(benchmark, trees, batch, count, hidden):
    """`count` forests of `batch` trees (grids, sequences) each."""
    if benchmark.structure == "perfect":
        return [rj.Forest.perfect(7, num_trees=batch, seed=s) for s in range(count)]
    if benchmark.structure == "grid":
        dag_rnn = importlib.import_module("dag_rnn")
        return [dag_rnn.grids(batch, hidden, seed=s) for s in range(count)]
    if benchmark.structure == "sequence":
        rng = np.random.default_rng(0)
        return [rj.Forest.from_sequences([100] * batch,
                                         fields={"word": rng.integers(0, 1000, 100 * batch)})
                for _ in range(count)]
    if trees is None:
        return [rj.Forest.random_binary(batch, seed=s) for s in range(count)]
    return [rj.Forest.from_ptb(trees[s * batch:(s + 1) * batch], vocab=VOCAB)
            for s in range(count)]


def flops(compiled, linearized, per_leaf=False):
    """Multiply-adds ×2 of the matrix products the kernel does on this forest: the leaf
    products once per distinct word where the kernel computes them so, unless `per_leaf`
    (a jacobian needs each leaf's own)."""
    cell, key = compiled.cell, compiled.kernel.distinct_key
    internal, edges = linearized.leaf_begin, int(linearized.child_ptr[linearized.leaf_begin])
    leaves = (distinct(linearized.fields[key][internal:])[0].size if key and not per_leaf
              else linearized.num_leaves)
    total = 0
    for case in cell.cases:
        for op in case.ops:
            if op.kind not in ("matvec", "matmul"):
                continue
            rows, inner = case.ops[op.args[0]].shape
            work = 2 * rows * inner * (op.shape[1] if op.kind == "matmul" else 1)
            count = (leaves if case.name == "leaf"
                     else edges if op.per_child else internal)
            total += work * count
    return total


def matmul_roof():
    """The machine's float32 matrix-multiply rate in GFLOP/s: the higher of NumPy's BLAS at
    2048² and recjit's own product at the size of a TreeLSTM h512 weight gradient (1536 × 512,
    over 256 nodes, which its blocks' caches hold). A BLAS whose kernels leave half of each
    vector unit idle (OpenBLAS's AVX2 ones on an AVX-512 CPU) would otherwise set a roof
    below what recjit reaches."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(2048, 2048)).astype(np.float32)
    blas = 2 * 2048 ** 3 / median_seconds([lambda: a @ a] * 5)
    cpu_calls.export(np.float32)
    a_rows = rng.normal(size=(256, 1536)).astype(np.float32)
    b_rows = rng.normal(size=(256, 512)).astype(np.float32)
    y = np.empty((512, 1536), dtype=np.float32)
    own = 2 * y.size * 256 / median_seconds(
        [lambda: cpu_calls.weight_gradient(numba.get_num_threads(), a_rows, b_rows, y, 32)] * 5)
    return max(blas, own) / 1e9


def seconds_each(calls):
    """The time of each call, in order."""
    times = []
    for call in calls:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def median_seconds(calls):
    """Median time of the calls after the first (the warm-up)."""
    calls[0]()
    return float(np.median(seconds_each(calls[1:] or calls)))


def in_rounds(runs_of, rounds):
    """{peer: median seconds of a run}: in each round every peer runs all its batches back to
    back, after one warm-up run, so that a slow spell of this shared host falls on the peers
    of a round alike rather than on whichever peer it happened to be timing. Back to back,
    because a peer's first run after another's is slower (numba's threads have gone to sleep),
    and a stream of requests would not pay that on every run."""
    times = {peer: [] for peer in runs_of}
    for _ in range(rounds):
        for peer, runs in runs_of.items():
            runs[0]()
            times[peer] += seconds_each(runs)
    return {peer: float(np.median(samples)) for peer, samples in times.items()}


def peers(name, cuda):
    """{peer: factory or the reason it is absent}, NumPy's naive recursion aside."""
    found = {}
    for peer, (module_name, table) in {**PEER_MODULES, **(GPU_PEERS if cuda else {})}.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            found[peer] = f"absent: {error.name or error} is not installed"
            continue
        found[peer] = getattr(module, table).get(name, "absent: no implementation yet")
    return found


def prepared_run(model, forest, p, backend):
    """A run of `forest` validated and linearized ahead (`model.prepare`, outside the timer):
    the kernel's latency with linearization reported apart, as docs/design.md §8 has it."""
    prepared = model.prepare(forest, p, backend=backend)
    return lambda: model.run(prepared, p, backend=backend).roots[0]


def measure(benchmark, hidden, batch, forests, repeat, cuda, cuda_threads=()):
    """One row: every candidate on the same forests. `cuda_threads`: also run recjit's CUDA
    kernel at each of these threads a block (`Schedule(threads=...)`), beside the default."""
    module = importlib.import_module(benchmark.name)
    model = getattr(module, benchmark.name)
    vocab_size = max(int(f.fields["word"].max()) + 1 for f in forests) \
        if "word" in forests[0].fields else 1
    p = module.make_params(hidden, vocab_size, "float32")
    start = time.perf_counter()
    model.run(forests[0], p)
    compile_s = time.perf_counter() - start
    references = [model.reference(f, p).roots[0] for f in forests]
    linearize_s = median_seconds([lambda f=f: model.linearize(f) for f in forests] * repeat)
    compiled = model.compile(forests[0], p)
    work = float(np.mean([flops(compiled, model.linearize(f)) for f in forests]))
    row = {"model": benchmark.name, "hidden": hidden, "batch": batch,
           "nodes": float(np.mean([f.num_nodes for f in forests])),
           "compile_s": compile_s, "linearize_ms": 1e3 * linearize_s, "gflop": work / 1e9,
           "ms": {}, "absent": {}, "max_error": {}}
    candidates = {"recjit cpu": lambda f: (lambda: model.run(f, p).roots[0]),
                  "numpy recursion": lambda f: (lambda: model.reference(f, p).roots[0])}
    if cuda:
        on_device = p.to_device()
        start = time.perf_counter()
        model.run(forests[0], on_device, backend="cuda")
        row["cuda_compile_s"] = time.perf_counter() - start
        candidates["recjit cuda"] = lambda f: (
            lambda: model.run(f, on_device, backend="cuda").roots[0])
        candidates[PREPARED] = lambda f: prepared_run(model, f, on_device, "cuda")
        for threads in cuda_threads:
            schedule = rj.Schedule(threads=threads)
            model.run(forests[0], on_device, backend="cuda", schedule=schedule)
            candidates[f"recjit cuda {threads} threads"] = lambda f, schedule=schedule: (
                lambda: model.run(f, on_device, backend="cuda", schedule=schedule).roots[0])
    for peer, factory in peers(benchmark.name, cuda).items():
        if isinstance(factory, str):
            row["absent"][peer] = factory
        else:
            candidates[peer] = lambda f, factory=factory: factory(f, p)
    runs_of = {}
    for peer, factory in candidates.items():
        runs_of[peer] = [factory(f) for f in forests]
        errors = []
        for run, ref in zip(runs_of[peer], references):
            got = run()
            np.testing.assert_allclose(got, ref, err_msg=f"{peer} disagrees with the "
                                       f"reference on {benchmark.name}", **TOLERANCE)
            errors.append(np.max(np.abs(got - ref) / (1 + np.abs(ref))))
        row["max_error"][peer] = float(max(errors))
    row["ms"] = {peer: 1e3 * seconds for peer, seconds in in_rounds(runs_of, repeat).items()}
    recjit_ms = row["ms"]["recjit cpu"]
    row["gflops"] = work / (recjit_ms / 1e3) / 1e9
    row["speedup"] = {peer: ms / recjit_ms for peer, ms in row["ms"].items()
                      if peer != "recjit cpu"}
    return row


def targets(results):
    """The CPU targets, judged on this run's rows: [(target, measured, met)]."""
    rows = {(r["model"], r["hidden"], r["batch"]): r for r in results["rows"]}
    judged = []

    def ratio(key, peer, wanted, text):
        row = rows.get(key)
        if row and peer in row["speedup"]:
            value = row["speedup"][peer]
            judged.append((text, f"{value:.2f}x", value >= wanted))

    ratio(("tree_lstm", 256, 10), "dynet autobatch", 6, "TreeLSTM h256 b10: ≥ 6x DyNet")
    ratio(("tree_lstm", 256, 10), "pytorch level-batched", 3,
          "TreeLSTM h256 b10: ≥ 3x PyTorch level-batched")
    ratio(("tree_lstm", 256, 1), "dynet autobatch", 5, "TreeLSTM h256 b1: ≥ 5x DyNet")
    slowest = min(((speedup, f"{row['model']} h{row['hidden']} b{row['batch']} vs {peer}")
                   for row in results["rows"] for peer, speedup in row["speedup"].items()
                   if not peer.startswith("recjit cuda") and peer not in GPU_PEERS),
                  default=None)
    if slowest:
        judged.append(("every model run faster than every peer",
                       f"closest: {slowest[0]:.2f}x ({slowest[1]})", slowest[0] > 1))
    row = rows.get(("tree_lstm", 512, 10))
    if row:
        share = row["gflops"] / results["matmul_gflops"]
        judged.append(("TreeLSTM h512 b10: ≥ 50% of the matmul roof",
                       f"{row['gflops']:.0f} GFLOP/s = {100 * share:.0f}%", share >= 0.5))
    return judged + gpu_targets(results["rows"])


def gpu_targets(rows):
    """The GPU targets: below Cortex's V100 latency, and ≥ 10x PyTorch level-batched on the GPU."""
    judged = []
    for row in rows:
        recjit_ms = row["ms"].get("recjit cuda")
        if recjit_ms is None:
            continue
        name = f"{row['model']} h{row['hidden']} b{row['batch']}"
        cortex = CORTEX_V100_MS.get(row["model"])
        smaller_hidden = next(b.hidden[0] for b in ZOO if b.name == row["model"])
        if cortex and row["hidden"] == smaller_hidden and row["batch"] in (1, 10):
            wanted = cortex[0 if row["batch"] == 1 else 1]
            judged.append((f"{name} CUDA: below Cortex's V100 {wanted} ms",
                           f"{recjit_ms:.3f} ms", recjit_ms < wanted))
            prepared_ms = row["ms"].get(PREPARED)
            if prepared_ms is not None:
                text = f"{name} CUDA, linearized ahead: below Cortex's V100 {wanted} ms"
                judged.append((text, f"{prepared_ms:.3f} ms", prepared_ms < wanted))
        torch_ms = row["ms"].get("pytorch level-batched cuda")
        if torch_ms is not None:
            judged.append((f"{name} CUDA: ≥ 10x PyTorch level-batched on the GPU",
                           f"{torch_ms / recjit_ms:.2f}x", torch_ms / recjit_ms >= 10))
    return judged


def gpu_facts():
    """The GPU numba.cuda sees (name, driver, versions), or None."""
    from numba import cuda
    if not cuda.is_available():
        return None
    device = cuda.get_current_device()
    name = device.name.decode() if isinstance(device.name, bytes) else device.name
    facts = {"name": name, "multiprocessors": device.MULTIPROCESSOR_COUNT,
             "driver": ".".join(map(str, cuda.cudadrv.driver.get_version())),
             "runtime": ".".join(map(str, cuda.runtime.get_version()))}
    try:
        facts["numba_cuda"] = importlib.import_module("numba_cuda").__version__
    except ImportError:
        facts["numba_cuda"] = "built into numba"
    return facts


def markdown(results):
    peer_names = sorted({peer for row in results["rows"] for peer in row["ms"]}
                        - {"recjit cpu"})
    lines = [f"# recjit benchmark: {results['machine']}", "",
             f"{results['cpu']}; numba {results['versions']['numba']}, NumPy "
             f"{results['versions']['numpy']}; float32 matmul roof "
             f"{results['matmul_gflops']:.0f} GFLOP/s"
             + (f"; GPU {_gpu_line(results['gpu'])}" if results.get("gpu") else "")
             + ". Median ms per batch; in brackets, how many times slower than recjit cpu.", "",
             "| model | hidden | batch | recjit cpu | GFLOP/s | compile s | linearize ms | "
             + " | ".join(peer_names) + " |",
             "|---" * (7 + len(peer_names)) + "|"]
    for row in results["rows"]:
        cells = [f"{row['ms'][p]:.2f} ({row['speedup'][p]:.1f}x)" if p in row["ms"]
                 else "absent" for p in peer_names]
        lines.append(f"| {row['model']} | {row['hidden']} | {row['batch']} | "
                     f"{row['ms']['recjit cpu']:.3f} | {row['gflops']:.1f} | "
                     f"{row['compile_s']:.2f} | {row['linearize_ms']:.3f} | "
                     + " | ".join(cells) + " |")
    absent = {(peer, reason) for row in results["rows"] for peer, reason in row["absent"].items()}
    lines += [""] + [f"- {peer}: {reason}" for peer, reason in sorted(absent)]
    lines += ["", "| target | this run | met |", "|---|---|---|"]
    lines += [f"| {text} | {value} | {'yes' if met else 'no'} |"
              for text, value, met in results["targets"]]
    return "\n".join(lines) + "\n"


def _gpu_line(gpu):
    return (f"{gpu['name']} ({gpu['multiprocessors']} multiprocessors, driver {gpu['driver']}, "
            f"runtime {gpu['runtime']}, numba-cuda {gpu['numba_cuda']})")


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = sorted({row["model"] for row in results["rows"]})
    all_peers = sorted({peer for row in results["rows"] for peer in row["ms"]})
    colours = dict(zip(all_peers, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    columns = 3
    figure, axes = plt.subplots((len(models) + columns - 1) // columns, columns,
                                figsize=(11, 3 * ((len(models) + columns - 1) // columns)),
                                squeeze=False)
    for axis, name in zip(axes.flat, models):
        rows = [r for r in results["rows"] if r["model"] == name and r["batch"] == 10]
        for peer in all_peers:
            points = sorted((r["hidden"], r["ms"][peer]) for r in rows if peer in r["ms"])
            if points:
                axis.plot(*zip(*points), marker="o", label=peer, color=colours[peer])
        axis.set_title(f"{name}, batch 10", fontsize=9)
        axis.set_xlabel("hidden", fontsize=8)
        axis.set_ylabel("ms per batch", fontsize=8)
        axis.set_yscale("log")
    for axis in list(axes.flat)[len(models):]:
        axis.axis("off")
    handles = [plt.Line2D([], [], color=colours[p], marker="o") for p in all_peers]
    figure.legend(handles, all_peers, loc="lower center", ncol=len(all_peers), fontsize=8)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    figure.savefig(path, dpi=110)
    return path


def zoo_models(text):
    """An argparse type: comma-separated names of the zoo's models."""
    names = [benchmark.name for benchmark in ZOO]
    for name in text.split(","):
        if name not in names:
            raise argparse.ArgumentTypeError(f"no model {name!r} in the zoo: {', '.join(names)}")
    return text


def add_common_arguments(parser):
    """--trees, --models and --cuda, which every benchmark script takes."""
    parser.add_argument("--trees", default=DEFAULT_TREES)
    parser.add_argument("--models", type=zoo_models, default=",".join(b.name for b in ZOO))
    parser.add_argument("--cuda", action=argparse.BooleanOptionalAction, default=None,
                        help="also run on the GPU (default: when numba.cuda finds one)")


def setup(parser, args, machine=None):
    """(the results header, the SST lines or None) for the common arguments: the machine
    (`machine`, else the GPU's name, else cpu-<n>core), CPU, trees, versions and GPU."""
    gpu = gpu_facts() if args.cuda is not False else None
    if args.cuda and gpu is None:
        parser.error("--cuda: numba.cuda finds no GPU here")
    machine = machine or (gpu["name"].lower().replace(" ", "-") if gpu
                          else f"cpu-{os.cpu_count()}core")
    trees = None
    if args.trees and os.path.exists(args.trees):
        with open(args.trees) as handle:
            trees = [line for line in handle if line.strip()]
    header = {"machine": machine, "cpu": cpu_facts(), "trees": args.trees if trees else "synthetic",
              "versions": {"python": platform.python_version(), "numpy": np.__version__,
                           "numba": numba.__version__, "recjit": rj.__version__},
              "gpu": gpu}
    return header, trees


def cpu_facts():
    """The CPU as numba compiles for it: its LLVM name, its cores, and the vector width the
    CPU kernels use (64 bytes with AVX-512, 32 without), which sets their speed."""
    name = cpu_target.target_context.codegen().magic_tuple()[1]
    return (f"{platform.processor() or platform.machine()} ({name}), {os.cpu_count()} cores, "
            f"{VECTOR_BYTES}-byte vectors")


def write_results(base, results, markdown_text, plot_to=None):
    """`base`.json, `base`.md and, with `plot_to` where matplotlib is installed, `base`.png."""
    with open(base + ".json", "w") as handle:
        json.dump(results, handle, indent=1)
    with open(base + ".md", "w") as handle:
        handle.write(markdown_text)
    plotted = plot_to(results, base + ".png") if plot_to else None
    print(f"wrote {base}.json, {base}.md" + (f", {plotted}" if plotted else ""))


# The rows measured so far, rewritten after each: a run stopped by a time limit (a GPU call's)
# leaves them for `--merge`.
PARTIAL = ".partial.json"


def write_partial(base, results):
    with open(base + PARTIAL, "w") as handle:
        json.dump(results, handle, indent=1)


def remove_partial(base):
    if os.path.exists(base + PARTIAL):
        os.remove(base + PARTIAL)


def merge(paths, machine):
    """One results file from runs of the same machine over different models (a GPU call's
    time limit splits the full bench; a run the limit stopped left `NAME.partial.json`): their
    rows in the zoo's order, the highest roof any of them measured, the targets judged again
    on all the rows."""
    parts = []
    for path in paths:
        with open(path) as handle:
            parts.append(json.load(handle))
    order = [b.name for b in ZOO]
    results = {**parts[0], "machine": machine, "merged_from": [p["machine"] for p in parts],
               "rows": sorted((row for part in parts for row in part["rows"]),
                              key=lambda row: (order.index(row["model"]), row["hidden"],
                                               row["batch"])),
               "matmul_gflops": max(p["matmul_gflops"] for p in parts),
               "matmul_gflops_at_end": max(p["matmul_gflops_at_end"] for p in parts)}
    results["targets"] = targets(results)
    write_results(os.path.join(HERE, "results", machine), results, markdown(results), plot)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="hs only, fewer batches (< 2 min)")
    parser.add_argument("--machine", default=None,
                        help="results file name (default: the GPU's name, else cpu-<n>core)")
    parser.add_argument("--cuda-threads", default="",
                        help="comma-separated threads a block to run recjit's CUDA kernel at "
                             "too, beside the default (Schedule(threads=...))")
    parser.add_argument("--merge", nargs="+", metavar="PART.json",
                        help="write one results file (--machine) from these and run nothing")
    args = parser.parse_args()
    if args.merge:
        if not args.machine:
            parser.error("--merge needs --machine, the merged file's name")
        return merge(args.merge, args.machine)
    header, trees = setup(parser, args, args.machine)
    gpu = header["gpu"]
    count, repeat = (4, 1) if args.quick else (20, 3)
    roof = matmul_roof()
    results = {**header, "matmul_gflops": roof, "matmul_gflops_at_end": roof, "rows": []}
    base = os.path.join(HERE, "results", results["machine"])
    print(f"float32 matmul roof: {results['matmul_gflops']:.0f} GFLOP/s")
    for benchmark in ZOO:
        if benchmark.name not in args.models.split(","):
            continue
        for hidden in benchmark.hidden[:1] if args.quick else benchmark.hidden:
            for batch in (1, 10):
                forests = batches(benchmark, trees, batch, count, hidden)
                row = measure(benchmark, hidden, batch, forests, repeat, gpu is not None,
                              [int(t) for t in args.cuda_threads.split(",") if t])
                results["rows"].append(row)
                write_partial(base, results)
                print(f"{row['model']:>16} h{hidden:<4} b{batch:<3} recjit "
                      f"{row['ms']['recjit cpu']:8.3f} ms {row['gflops']:6.1f} GFLOP/s | "
                      + "  ".join(f"{peer} {ms:.2f} ms ({row['speedup'][peer]:.1f}x)"
                                  for peer, ms in row["ms"].items() if peer != "recjit cpu"),
                      flush=True)
    for module in ("torch", "dynet"):
        try:
            results["versions"][module] = importlib.import_module(module).__version__
        except (ImportError, AttributeError):
            results["versions"][module] = "absent"
    results["matmul_gflops_at_end"] = matmul_roof()
    results["matmul_gflops"] = max(results["matmul_gflops"], results["matmul_gflops_at_end"])
    print(f"float32 matmul roof at the end: {results['matmul_gflops_at_end']:.0f} GFLOP/s; "
          f"the higher of the two is the roof")
    results["targets"] = targets(results)
    for text, value, met in results["targets"]:
        print(f"target {text}: {value} ({'met' if met else 'NOT met'})")
    write_results(base, results, markdown(results), plot)
    remove_partial(base)


if __name__ == "__main__":
    main()
