"""What every example shares: arguments, the trees, timing, and the report."""
import argparse
import os
import time

import numpy as np

import recjit as rj

SST = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                   "shared", "data", "sst"))
SST_TEST = os.path.join(SST, "test.txt")
STRUCTURES = {"tree": "trees", "dag": "DAGs", "sequence": "sequences"}


def positive(text):
    """An argparse type: a whole number, at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def existing_file(text):
    """An argparse type: the path of a file that is there."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no file {text!r}")
    return text


def arguments(description, hidden):
    """The parser, and the arguments it parsed."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--hidden", type=positive, default=hidden,
                        help="hidden size (default: %(default)s)")
    parser.add_argument("--batch", type=positive, default=10,
                        help="trees (grids, sequences) per batch (default: %(default)s)")
    parser.add_argument("--trees", type=existing_file, default=None,
                        help="SST trees in PTB format (default: ../shared/data/sst/test.txt "
                             "where it is, else a generated sample)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                        help="of the parameters and states (default: %(default)s)")
    return parser, parser.parse_args()


def load_trees(path, batch):
    """The first `batch` trees of a PTB file (by default SST's test set, where it is), or a
    generated sample of SST-like trees."""
    if path is None and os.path.exists(SST_TEST):
        path = SST_TEST
    if path is None:
        return rj.Forest.random_binary(batch, seed=0), "generated sample"
    with open(path) as handle:
        lines = [line for _, line in zip(range(batch), handle)]
    return rj.Forest.from_ptb(lines), path


def load_sentences(path, batch, length=100, vocab_size=1000):
    """Word-id sequences: the sentences (leaf words in order) of the first `batch` SST trees,
    or `batch` random sequences of `length` words."""
    if path is None:
        rng = np.random.default_rng(0)
        words = rng.integers(0, vocab_size, batch * length)
        return (rj.Forest.from_sequences([length] * batch, fields={"word": words}),
                f"generated sequences of length {length}")
    trees, _ = load_trees(path, batch)
    sentences = []
    for root in trees.roots:
        stack, words = [int(root)], []
        while stack:
            node = stack.pop()
            children = trees.children(node)
            if children.size == 0:
                words.append(int(trees.fields["word"][node]))
            stack.extend(int(c) for c in children[::-1])
        sentences.append(words)
    in_order = np.array([word for sentence in sentences for word in sentence], dtype=np.int64)
    return (rj.Forest.from_sequences([len(s) for s in sentences], fields={"word": in_order}),
            f"sentences of {path}")


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
    print(f"{model.__name__} on {forest.roots.size} {STRUCTURES[forest.kind]}, "
          f"{forest.num_nodes} nodes ({source})")
    print(f"  first run (compile + run): {compile_s:.2f} s")
    print(f"  max error vs reference:    {error:.2e} (|a - b| / (1 + |b|))")
    print(f"  recjit cpu:                {compiled_ms:.3f} ms")
    ratio = (f"{reference_ms / compiled_ms:.1f}x recjit's time" if reference_ms >= compiled_ms
             else f"recjit takes {compiled_ms / reference_ms:.1f}x as long")
    print(f"  reference recursion:       {reference_ms:.3f} ms  ({ratio})")
    return error


def main(model, make_params, doc, hidden=256, make_forest=None):
    """An example's command line: parse, build the forest (`make_forest(args)`, by default the
    SST trees), make parameters, report."""
    parser, args = arguments(" ".join(doc.split("\n\n")[0].split()), hidden)
    read = make_forest or (lambda a: load_trees(a.trees, a.batch))
    forest, source = read_or_refuse(parser, args.trees, lambda: read(args))
    words = forest.fields.get("word")
    vocab_size = 1 if words is None else int(words.max()) + 1
    return report(model, forest, make_params(args.hidden, vocab_size, args.dtype), source)


def read_or_refuse(parser, path, read):
    """(the forest, its source) that `read()` gives from file `path`, the `--trees` argument;
    a file recjit refuses, or one with no trees in it, is `parser`'s error."""
    try:
        forest, source = read()
    except rj.InputError as error:
        parser.error(f"--trees {path}: {error}")
    if forest.num_nodes == 0:
        parser.error(f"--trees {path}: no trees in it")
    return forest, source


def initializer(hidden, dtype, seed):
    """`normal(*shape)`: Gaussian weights with scale 1/sqrt(hidden), reproducible by seed."""
    rng = np.random.default_rng(seed)
    default_scale = 1 / np.sqrt(hidden)

    def normal(*shape, scale=default_scale):
        return rng.normal(0, scale, shape).astype(dtype)

    return normal
