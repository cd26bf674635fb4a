"""Attention over any number of children, written as NumPy code keeps it: weights stored
(inputs, outputs) and multiplied as `h @ p.W`, a child's score `np.exp(np.dot(h, p.a))`, the
children's states weighted by their scores.

    python examples/tree_attention.py [--hidden 256] [--batch 10] [--trees ../shared/data/sst/test.txt]
"""
import numpy as np

import recjit as rj
from common import initializer, main


@rj.recursive_model(arity=None)
def tree_attention(node, p):
    if node.is_leaf:
        return np.tanh(p.E[node.word] @ p.W)
    states = [tree_attention(child, p) for child in node.children]
    scores = [np.exp(np.dot(h, p.a)) for h in states]
    context = sum(score * h for score, h in zip(scores, states)) / sum(scores)
    return np.tanh(context @ p.U + p.b)


def make_params(hidden, vocab_size, dtype="float32", seed=0):
    normal = initializer(hidden, dtype, seed)
    return rj.Params(E=normal(vocab_size, hidden, scale=1.0), W=normal(hidden, hidden),
                     U=normal(hidden, hidden), a=normal(hidden), b=normal(hidden))


if __name__ == "__main__":
    main(tree_attention, make_params, __doc__)
