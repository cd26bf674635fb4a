"""`Forest`: a batch of trees or DAGs as CSR arrays plus named per-node fields.

Constructors never recurse in Python, so a chain of any depth can be built."""
import re

import numpy as np

from ..errors import InputError

KINDS = ("tree", "dag", "sequence")


class Forest:
    """Nodes 0..num_nodes-1; the children of node n are
    `child_idx[child_ptr[n]:child_ptr[n+1]]`, in order (left first)."""

    def __init__(self, child_ptr, child_idx, roots, fields=None, kind="tree", vocab=None):
        if kind not in KINDS:
            raise InputError(f"Forest kind must be one of {KINDS}, not {kind!r}")
        self.child_ptr = np.ascontiguousarray(child_ptr, dtype=np.int64)
        self.child_idx = np.ascontiguousarray(child_idx, dtype=np.int64)
        self.roots = np.ascontiguousarray(roots, dtype=np.int64)
        if self.child_ptr.ndim != 1 or self.child_ptr.size == 0:
            raise InputError("child_ptr must be a 1-d array of num_nodes + 1 offsets")
        self.num_nodes = self.child_ptr.size - 1
        self.fields = {}
        for name, values in (fields or {}).items():
            values = np.asarray(values)
            if values.ndim == 0 or values.shape[0] != self.num_nodes:
                raise InputError(f"field {name!r} has shape {values.shape}; "
                                 f"its first dimension must be num_nodes = {self.num_nodes}")
            self.fields[name] = np.ascontiguousarray(values)
        self.kind = kind
        self.vocab = vocab

    @property
    def labels(self):
        return self.fields.get("label")

    @property
    def num_children(self):
        return np.diff(self.child_ptr)

    def children(self, n):
        return self.child_idx[self.child_ptr[n]:self.child_ptr[n + 1]]

    def __repr__(self):
        return (f"Forest(kind={self.kind!r}, num_nodes={self.num_nodes}, "
                f"num_roots={self.roots.size}, fields={sorted(self.fields)})")

    @classmethod
    def from_nested(cls, trees, leaf_field="word"):
        """Trees as nested tuples or lists whose leaves are ints (stored in `leaf_field`;
        -1 for internal nodes). Nodes are numbered in pre-order."""
        builder = _Builder()
        roots = []
        for tree in trees:
            roots.append(builder.add_nested(tree))
        return builder.forest(roots, leaf_field, kind="tree")

    @classmethod
    def random_binary(cls, num_trees, seed=0, mean_leaves=19, vocab_size=1000):
        """Random full binary trees (random splits give SST-like heights), leaf words uniform
        in 0..vocab_size-1: a stand-in where the SST files are absent."""
        rng = np.random.default_rng(seed)
        trees = []
        for _ in range(num_trees):
            leaves = max(1, int(rng.poisson(mean_leaves)))
            words = [int(w) for w in rng.integers(0, vocab_size, leaves)]
            trees.append(random_bracketing(words, rng))
        return cls.from_nested(trees)

    @classmethod
    def from_ptb(cls, lines, vocab=None):
        """Trees in PTB bracket format, one per line (`(label child child)`, `(label word)`).

        Leaf words get ids from `vocab` (a dict, extended with unseen words); `.vocab` holds
        it, field `word` the ids (-1 inside), field `label` every node's label."""
        vocab = {} if vocab is None else vocab
        next_id = max(vocab.values(), default=-1) + 1

        def word_id(word):
            nonlocal next_id
            if word not in vocab:
                vocab[word] = next_id
                next_id += 1
            return vocab[word]

        builder = _Builder()
        roots = []
        for line_number, line in enumerate(lines, 1):
            if line.strip():
                roots.append(builder.add_ptb(line, line_number, word_id))
        forest = builder.forest(roots, "word", kind="tree")
        forest.fields["label"] = np.asarray(builder.labels, dtype=np.int64)
        forest.vocab = vocab
        return forest

    @classmethod
    def from_edges(cls, num_nodes, edges, fields=None, kind="dag"):
        """Edges `(parent, child)`; a node's children keep the order of its edges. Roots are the
        nodes that are nobody's child."""
        edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
            bad = edges[(edges < 0).any(axis=1) | (edges >= num_nodes).any(axis=1)][0]
            raise InputError(f"edge {tuple(int(v) for v in bad)} names a node outside "
                             f"0..{num_nodes - 1}")
        order = np.argsort(edges[:, 0], kind="stable")
        child_idx = edges[order, 1]
        counts = np.bincount(edges[:, 0], minlength=num_nodes)
        child_ptr = np.concatenate([[0], np.cumsum(counts)])
        is_child = np.zeros(num_nodes, dtype=bool)
        is_child[edges[:, 1]] = True
        roots = np.flatnonzero(~is_child)
        return cls(child_ptr, child_idx, roots, fields, kind)


def random_bracketing(words, rng):
    """A random full binary tree (nested tuples) over `words`, built bottom-up without
    recursion: random adjacent pairs are joined until one tree remains."""
    items = list(words)
    while len(items) > 1:
        position = int(rng.integers(0, len(items) - 1))
        items[position:position + 2] = [(items[position], items[position + 1])]
    return items[0]


_PTB_TOKEN = re.compile(r"\(|\)|[^()]+")


class _Builder:
    """Accumulates nodes in pre-order with explicit stacks (no Python recursion)."""

    def __init__(self):
        self.children = []
        self.leaf_values = []
        self.labels = []

    def new_node(self, leaf_value=-1, label=-1):
        self.children.append([])
        self.leaf_values.append(leaf_value)
        self.labels.append(label)
        return len(self.children) - 1

    def add_nested(self, tree):
        root = None
        stack = [(tree, None)]
        while stack:
            subtree, parent = stack.pop()
            if isinstance(subtree, (tuple, list)):
                if not subtree:
                    raise InputError("an empty tuple is not a tree node")
                node = self.new_node()
                stack.extend((child, node) for child in reversed(subtree))
            elif isinstance(subtree, (int, np.integer)) and not isinstance(subtree, bool):
                node = self.new_node(int(subtree))
            else:
                raise InputError(f"a nested-tuple leaf must be an int, not {subtree!r}")
            if parent is None:
                root = node
            else:
                self.children[parent].append(node)
        return root

    def add_ptb(self, line, line_number, word_id):
        open_nodes = []
        root = None
        tokens = _PTB_TOKEN.findall(line)
        position = 0
        while position < len(tokens):
            token = tokens[position]
            if token == "(":
                label_and_word = tokens[position + 1].strip() if position + 1 < len(tokens) else ""
                label, _, word = label_and_word.partition(" ")
                if not label.lstrip("-").isdigit():
                    raise InputError(f"PTB line {line_number}: expected a label after '(', "
                                     f"got {label_and_word!r}")
                node = self.new_node(label=int(label))
                if open_nodes:
                    self.children[open_nodes[-1]].append(node)
                elif root is None:
                    root = node
                else:
                    raise InputError(f"PTB line {line_number}: more than one tree on the line")
                open_nodes.append(node)
                word = word.strip()
                if word:
                    self.leaf_values[node] = word_id(word)
                position += 2
            elif token == ")":
                if not open_nodes:
                    raise InputError(f"PTB line {line_number}: unbalanced ')'")
                open_nodes.pop()
                position += 1
            elif token.strip():
                raise InputError(f"PTB line {line_number}: unexpected text {token.strip()!r}")
            else:
                position += 1
        if open_nodes or root is None:
            raise InputError(f"PTB line {line_number}: unbalanced brackets")
        return root

    def forest(self, roots, leaf_field, kind):
        counts = np.fromiter((len(c) for c in self.children), dtype=np.int64,
                             count=len(self.children))
        child_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        child_idx = np.fromiter((c for cs in self.children for c in cs), dtype=np.int64,
                                count=int(child_ptr[-1]))
        fields = {leaf_field: np.asarray(self.leaf_values, dtype=np.int64)}
        return Forest(child_ptr, child_idx, roots, fields, kind)
