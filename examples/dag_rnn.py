"""DAG-RNN on 10x10 grids (Cortex Table 2): every cell reads its left and upper neighbours,
h = relu(W x + U Σ_pred h_pred + b), with a feature vector x per cell.

    python examples/dag_rnn.py [--hidden 256] [--batch 10 grids]
"""
import numpy as np

import recjit as rj
from common import initializer, main

ROWS = COLS = 10


@rj.recursive_model(arity=None, kind="dag")
def dag_rnn(node, p):
    h_pred = sum((dag_rnn(pred, p) for pred in node.children), rj.zeros(p.b.shape))
    return rj.relu(p.W @ node.x + p.U @ h_pred + p.b)


def make_params(hidden, vocab_size=None, dtype="float32", seed=0):
    normal = initializer(hidden, dtype, seed)
    return rj.Params(W=normal(hidden, hidden), U=normal(hidden, hidden), b=normal(hidden))


def grids(num_grids, hidden, rows=ROWS, cols=COLS, dtype="float32", seed=0):
    """`num_grids` grid DAGs with random features x of size `hidden` per cell."""
    features = np.random.default_rng(seed).normal(size=(num_grids * rows * cols, hidden))
    return rj.Forest.grid_dag(rows, cols, fields={"x": features.astype(dtype)},
                              num_grids=num_grids)


def grid_forest(args):
    if args.trees is not None:
        raise SystemExit("dag_rnn runs on grids; --trees does not apply")
    return grids(args.batch, args.hidden, dtype=args.dtype), f"{ROWS}x{COLS} grids"


if __name__ == "__main__":
    main(dag_rnn, make_params, __doc__, make_forest=grid_forest)
