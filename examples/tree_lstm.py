"""Child-sum TreeLSTM (Tai et al. 2015) on binary SST trees: DESIGN §1's example.

    python examples/tree_lstm.py [--hidden 256] [--batch 10] [--trees ../shared/data/sst/test.txt]
"""
import numpy as np

import recjit as rj


@rj.recursive_model(arity=2)
def tree_lstm(node, p):
    if node.is_leaf:
        i, o, u = rj.split(p.W_iou @ p.E[node.word] + p.b_iou, 3)
        c = rj.sigmoid(i) * rj.tanh(u)
        return rj.sigmoid(o) * rj.tanh(c), c
    hl, cl = tree_lstm(node.left, p)
    hr, cr = tree_lstm(node.right, p)
    i, o, u = rj.split(p.U_iou @ (hl + hr) + p.b_iou, 3)
    fl = rj.sigmoid(p.U_f @ hl + p.b_f)
    fr = rj.sigmoid(p.U_f @ hr + p.b_f)
    c = rj.sigmoid(i) * rj.tanh(u) + fl * cl + fr * cr
    return rj.sigmoid(o) * rj.tanh(c), c


def make_params(hidden, vocab_size, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    scale = 1 / np.sqrt(hidden)

    def normal(*shape):
        return rng.normal(0, scale, shape).astype(dtype)

    return rj.Params(E=rng.normal(0, 1, (vocab_size, hidden)).astype(dtype),
                     W_iou=normal(3 * hidden, hidden), U_iou=normal(3 * hidden, hidden),
                     b_iou=normal(3 * hidden), U_f=normal(hidden, hidden), b_f=normal(hidden))


if __name__ == "__main__":
    import common
    common.main(tree_lstm, make_params, __doc__)
