"""MV-RNN (Socher et al. 2012) on binary SST trees: every node has a vector a and a matrix A;
a parent is p = tanh(W [B a; A b]), P = W_M [A; B] for children (a, A) and (b, B).

    python examples/mv_rnn.py [--hidden 64] [--batch 10] [--trees ../shared/data/sst/test.txt]
"""
import numpy as np

import recjit as rj
from common import initializer, main


@rj.recursive_model(arity=2)
def mv_rnn(node, p):
    if node.is_leaf:
        return p.E[node.word], p.E_M[node.word]
    a, A = mv_rnn(node.left, p)
    b, B = mv_rnn(node.right, p)
    return rj.tanh(p.W @ rj.concat([B @ a, A @ b])), p.W_M @ rj.concat([A, B])


def make_params(hidden, vocab_size, dtype="float32", seed=0):
    normal = initializer(hidden, dtype, seed)
    identity = np.eye(hidden, dtype=dtype)
    return rj.Params(E=normal(vocab_size, hidden, scale=1.0),
                     E_M=identity + normal(vocab_size, hidden, hidden, scale=0.01),
                     W=normal(hidden, 2 * hidden),
                     W_M=np.concatenate([identity, identity], 1) / 2
                     + normal(hidden, 2 * hidden, scale=0.01))


if __name__ == "__main__":
    main(mv_rnn, make_params, __doc__, hidden=64)
