"""Inference over a whole treebank: child-sum TreeLSTM's root state of every tree, run in
batches of trees of about one height, with a progress bar, saved in the file's order.

    python examples/sst_states.py [--trees ../shared/data/sst/train.txt] [--batch 256]
                                  [--hidden 150] [--output sst_states.npy]

The parameters are random here; a trained model's go in their place (`make_params`'s
names). It needs tqdm (`pip install -e '.[train]'`).
"""
import argparse
import os
import time

import numpy as np
from tqdm import tqdm

import recjit as rj
from common import SST, existing_file, positive, read_or_refuse
from tree_lstm import child_sum_tree_lstm, make_params


def root_states(forest, p, batch):
    """The `h` of every root of `forest`, in the order of `forest.roots`."""
    states = np.empty((forest.roots.size, p.b_f.shape[0]), dtype=p.b_f.dtype)
    batches = forest.batches(batch, bucket_by_height=True, indices=True)
    for positions, trees in tqdm(batches, unit="batch", desc="states"):
        states[positions] = child_sum_tree_lstm.run(trees, p).roots[0]
    return states


def read_ptb(path):
    with open(path) as lines:
        return rj.Forest.from_ptb(lines), path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=existing_file, default=os.path.join(SST, "train.txt"),
                        help="a PTB file, a tree a line (default: SST's train.txt)")
    parser.add_argument("--batch", type=positive, default=256,
                        help="trees per batch (default: %(default)s)")
    parser.add_argument("--hidden", type=positive, default=150,
                        help="hidden size (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                        help="of the parameters and states (default: %(default)s)")
    parser.add_argument("--output", default="sst_states.npy",
                        help="the .npy file written (default: %(default)s)")
    args = parser.parse_args()
    forest, _ = read_or_refuse(parser, args.trees, lambda: read_ptb(args.trees))
    p = make_params(args.hidden, len(forest.vocab), args.dtype)
    started = time.perf_counter()
    states = root_states(forest, p, args.batch)
    seconds = time.perf_counter() - started
    np.save(args.output, states)
    print(f"{forest.roots.size} trees, {forest.num_nodes} nodes in {seconds:.2f} s (the first "
          f"batch compiles or loads the kernel); states {states.shape} written to "
          f"{args.output}")


if __name__ == "__main__":
    main()
