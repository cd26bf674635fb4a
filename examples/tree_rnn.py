"""TreeRNN on binary SST trees: h = tanh(W h_l + U h_r + b), a leaf's h = E[word].

    python examples/tree_rnn.py [--hidden 256] [--batch 10] [--trees ../shared/data/sst/test.txt]
"""
import recjit as rj
from common import initializer, main


@rj.recursive_model(arity=2)
def tree_rnn(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return rj.tanh(p.W @ tree_rnn(node.left, p) + p.U @ tree_rnn(node.right, p) + p.b)


def make_params(hidden, vocab_size, dtype="float32", seed=0):
    normal = initializer(hidden, dtype, seed)
    return rj.Params(E=normal(vocab_size, hidden, scale=1.0), W=normal(hidden, hidden),
                     U=normal(hidden, hidden), b=normal(hidden))


if __name__ == "__main__":
    main(tree_rnn, make_params, __doc__)
