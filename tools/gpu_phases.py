"""Where a fused CUDA kernel's time per batch goes, on a real GPU: the generated kernel of a
deep tree (tools/gpu_levels.py's comb) timed against copies of its source with steps of the
batch loop taken out: the products, the elementwise ops, both (its barriers alone), and all
but one barrier. The copies compute wrong states; only their time is read.

    python tools/gpu_phases.py [--models tree_lstm] [--depth 64]"""
import argparse
import importlib
import os
import sys

from gpu_levels import comb, queued_ms

import recjit as rj
from recjit.codegen_cuda import device, runtime
from recjit.generated import load_module

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
import bench

LOOP = "    for b in range("


def split_loop(source):
    """The source's lines before the batch loop's body, the body, and the lines after."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(LOOP)) + 1
    end = start
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith(" " * 8)):
        end += 1
    return lines[:start], lines[start:end], lines[end:]


def indent(line):
    return len(line) - len(line.lstrip())


def drop_block(body, text):
    """The body without the statement whose line holds `text`, and what it holds."""
    kept, depth = [], None
    for line in body:
        if depth is not None and line.strip() and indent(line) > depth:
            continue
        depth = None
        if text in line:
            depth = indent(line)
            continue
        kept.append(line)
    return kept


def variants(body):
    head = [line for line in body if line.strip().startswith(("begin =", "count ="))]
    products = ("matmul_rows(", "matmul_units(", "matmul_row_groups(", "multiply_tile(")
    no_products = [line for line in body if not any(call in line for call in products)]
    return {"as generated": body,
            "no products": no_products,
            "no elementwise": drop_block(body, "for item in range("),
            "barriers alone": drop_block(no_products, "for item in range("),
            "one barrier": head + ["        grid.sync()"],
            "no barrier": head}


def measure(name, hidden, depth, runs):
    module = importlib.import_module(name)
    model = getattr(module, name)
    forest = rj.Forest.from_ptb([comb(depth)])
    p = module.make_params(hidden, depth + 1, "float32").to_device()
    model.run(forest, p, backend="cuda")
    prepared = model.prepare(forest, p, backend="cuda")
    kernel = prepared.compiled.backend_kernel
    arguments, _ = kernel.prepare(prepared.linearized, p, prepared.inputs)
    before, body, after = split_loop(kernel.source)
    print(f"\n## {name} h{hidden}, a comb of depth {depth}: ms a launch, us a level")
    for label, edited in variants(body).items():
        source = "\n".join(before + edited + after) + "\n"
        tag = label.replace(" ", "_")
        function = getattr(load_module(source, f"{kernel.kernel.name}_{tag}",
                                       (runtime.__file__,)), kernel.kernel.name)
        launch = device.CooperativeLaunch(function, arguments, kernel.threads)
        ms = queued_ms(lambda launch=launch: launch(kernel.blocks, arguments), runs)
        print(f"{label:15s} {ms:7.3f} ms  {1e3 * ms / depth:6.2f} us", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tree_lstm")
    parser.add_argument("--depth", type=int, default=64)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    for name in args.models.split(","):
        hidden = next(b for b in bench.ZOO if b.name == name).hidden[0]
        measure(name, hidden, args.depth, args.runs)


if __name__ == "__main__":
    main()
