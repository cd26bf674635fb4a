"""TreeRNN on binary SST trees: h = tanh(W h_l + U h_r + b), a leaf's h = E[word].

    python examples/tree_rnn.py [--hidden 256] [--batch 10] [--trees ../shared/data/sst/test.txt]
"""
import numpy as np

import recjit as rj


@rj.recursive_model(arity=2)
def tree_rnn(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return rj.tanh(p.W @ tree_rnn(node.left, p) + p.U @ tree_rnn(node.right, p) + p.b)


def make_params(hidden, vocab_size, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    scale = 1 / np.sqrt(hidden)
    return rj.Params(E=rng.normal(0, 1, (vocab_size, hidden)).astype(dtype),
                     W=rng.normal(0, scale, (hidden, hidden)).astype(dtype),
                     U=rng.normal(0, scale, (hidden, hidden)).astype(dtype),
                     b=rng.normal(0, scale, hidden).astype(dtype))


if __name__ == "__main__":
    import common
    common.main(tree_rnn, make_params, __doc__)
