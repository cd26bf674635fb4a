"""Child-sum TreeGRU on SST trees: a GRU cell over the summed child state, with a reset gate
per child; U_h multiplies Σ_k r_k ⊙ h_k, a value of the same batch, so every batch has a
second phase behind a barrier.

    python examples/tree_gru.py [--hidden 256] [--batch 10] [--trees ../shared/data/sst/test.txt]
"""
import recjit as rj
from common import initializer, main


def gru_inputs(node, p):
    """The summed child state and the reset-gated sum, over any number of children."""
    h_sum = rj.zeros(p.b_z.shape)
    gated = rj.zeros(p.b_z.shape)
    for child in node.children:
        h_k = tree_gru(child, p)
        h_sum = h_sum + h_k
        gated = gated + rj.sigmoid(p.U_r @ h_k + p.b_r) * h_k
    return h_sum, gated


@rj.recursive_model(arity=None)
def tree_gru(node, p):
    h_sum, gated = gru_inputs(node, p)
    x_z, x_h = rj.split(p.W_zh @ p.E[node.word], 2) if node.is_leaf else (0, 0)
    z = rj.sigmoid(x_z + p.U_z @ h_sum + p.b_z)
    candidate = rj.tanh(x_h + p.U_h @ gated + p.b_h)
    return z * h_sum + (1 - z) * candidate


def make_params(hidden, vocab_size, dtype="float32", seed=0):
    normal = initializer(hidden, dtype, seed)
    return rj.Params(E=normal(vocab_size, hidden, scale=1.0), W_zh=normal(2 * hidden, hidden),
                     U_z=normal(hidden, hidden), U_r=normal(hidden, hidden),
                     U_h=normal(hidden, hidden), b_z=normal(hidden), b_r=normal(hidden),
                     b_h=normal(hidden))


if __name__ == "__main__":
    main(tree_gru, make_params, __doc__)
