"""A sequential LSTM as a recursive model over chains: step t's child is step t-1.

    python examples/lstm.py [--hidden 256] [--batch 10] [--trees PATH: SST sentences]
"""
import recjit as rj
from common import initializer, load_sentences, main


@rj.recursive_model(kind="sequence")
def lstm(step, p):
    x = p.W @ p.E[step.word] + p.b
    if step.is_leaf:  # the first step: h and c start at zero
        h_prev, c_prev = rj.zeros(p.U.shape[1]), rj.zeros(p.U.shape[1])
    else:
        h_prev, c_prev = lstm(step.children[0], p)
    i, f, o, u = rj.split(x + p.U @ h_prev, 4)
    c = rj.sigmoid(f) * c_prev + rj.sigmoid(i) * rj.tanh(u)
    return rj.sigmoid(o) * rj.tanh(c), c


def make_params(hidden, vocab_size, dtype="float32", seed=0):
    normal = initializer(hidden, dtype, seed)
    return rj.Params(E=normal(vocab_size, hidden, scale=1.0), W=normal(4 * hidden, hidden),
                     U=normal(4 * hidden, hidden), b=normal(4 * hidden))


if __name__ == "__main__":
    main(lstm, make_params, __doc__, make_forest=lambda a: load_sentences(a.trees, a.batch))
