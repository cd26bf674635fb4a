"""A sequential GRU as a recursive model over chains; U_h (r ⊙ h) multiplies a value of the
same step, so every step has two phases.

    python examples/gru.py [--hidden 256] [--batch 10] [--trees PATH: SST sentences]
"""
import recjit as rj
from common import initializer, load_sentences, main


@rj.recursive_model(kind="sequence")
def gru(step, p):
    x_z, x_r, x_h = rj.split(p.W @ p.E[step.word] + p.b, 3)
    h_prev = rj.zeros(p.U_h.shape[1]) if step.is_leaf else gru(step.children[0], p)
    h_z, h_r = rj.split(p.U_zr @ h_prev, 2)
    z = rj.sigmoid(x_z + h_z)
    r = rj.sigmoid(x_r + h_r)
    candidate = rj.tanh(x_h + p.U_h @ (r * h_prev))
    return (1 - z) * h_prev + z * candidate


def make_params(hidden, vocab_size, dtype="float32", seed=0):
    normal = initializer(hidden, dtype, seed)
    return rj.Params(E=normal(vocab_size, hidden, scale=1.0), W=normal(3 * hidden, hidden),
                     b=normal(3 * hidden), U_zr=normal(2 * hidden, hidden),
                     U_h=normal(hidden, hidden))


if __name__ == "__main__":
    main(gru, make_params, __doc__, make_forest=lambda a: load_sentences(a.trees, a.batch))
