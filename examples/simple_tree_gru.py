"""SimpleTreeGRU on SST trees: the TreeGRU cell with h = (1 − z) ⊙ h' (no carry of the
summed child state).

    python examples/simple_tree_gru.py [--hidden 256] [--batch 10] [--trees PATH]
"""
import recjit as rj
from common import main
from tree_gru import make_params


@rj.recursive_model(arity=None)
def simple_tree_gru(node, p):
    h_sum = rj.zeros(p.b_z.shape)
    gated = rj.zeros(p.b_z.shape)
    for child in node.children:
        h_k = simple_tree_gru(child, p)
        h_sum = h_sum + h_k
        gated = gated + rj.sigmoid(p.U_r @ h_k + p.b_r) * h_k
    x_z, x_h = rj.split(p.W_zh @ p.E[node.word], 2) if node.is_leaf else (0, 0)
    z = rj.sigmoid(x_z + p.U_z @ h_sum + p.b_z)
    return (1 - z) * rj.tanh(x_h + p.U_h @ gated + p.b_h)


if __name__ == "__main__":
    main(simple_tree_gru, make_params, __doc__)
