"""Child-sum TreeLSTM (Tai et al. 2015): docs/design.md §1's binary form on SST trees, and the same
cell for any number of children (`child_sum_tree_lstm`).

    python examples/tree_lstm.py [--hidden 256] [--batch 10] [--trees ../shared/data/sst/test.txt]
"""
import recjit as rj
from common import initializer, main


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


@rj.recursive_model(arity=None)
def child_sum_tree_lstm(node, p):
    h_sum = rj.zeros(p.b_f.shape)
    forgotten = rj.zeros(p.b_f.shape)
    for child in node.children:
        h_k, c_k = child_sum_tree_lstm(child, p)
        h_sum = h_sum + h_k
        forgotten = forgotten + rj.sigmoid(p.U_f @ h_k + p.b_f) * c_k
    x = p.W_iou @ p.E[node.word] if node.is_leaf else 0
    i, o, u = rj.split(x + p.U_iou @ h_sum + p.b_iou, 3)
    c = rj.sigmoid(i) * rj.tanh(u) + forgotten
    return rj.sigmoid(o) * rj.tanh(c), c


def make_params(hidden, vocab_size, dtype="float32", seed=0):
    normal = initializer(hidden, dtype, seed)
    return rj.Params(E=normal(vocab_size, hidden, scale=1.0),
                     W_iou=normal(3 * hidden, hidden), U_iou=normal(3 * hidden, hidden),
                     b_iou=normal(3 * hidden), U_f=normal(hidden, hidden), b_f=normal(hidden))


if __name__ == "__main__":
    main(tree_lstm, make_params, __doc__)
