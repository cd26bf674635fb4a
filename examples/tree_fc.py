"""TreeFC on perfect binary trees of height 7 (Cortex Table 2): h = tanh(W [h_l; h_r] + b),
a leaf's h = E[word].

    python examples/tree_fc.py [--hidden 256] [--batch 10] [--trees PTB file instead]
"""
import recjit as rj
from common import initializer, load_trees, main

HEIGHT = 7


@rj.recursive_model(arity=2)
def tree_fc(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return rj.tanh(p.W @ rj.concat([tree_fc(node.left, p), tree_fc(node.right, p)]) + p.b)


def make_params(hidden, vocab_size, dtype="float32", seed=0):
    normal = initializer(hidden, dtype, seed)
    return rj.Params(E=normal(vocab_size, hidden, scale=1.0), W=normal(hidden, 2 * hidden),
                     b=normal(hidden))


def perfect_trees(args):
    if args.trees is not None:
        return load_trees(args.trees, args.batch)
    return (rj.Forest.perfect(HEIGHT, num_trees=args.batch),
            f"perfect binary trees of height {HEIGHT}")


if __name__ == "__main__":
    main(tree_fc, make_params, __doc__, make_forest=perfect_trees)
