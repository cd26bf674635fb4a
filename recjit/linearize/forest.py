"""`Forest`: a batch of trees or DAGs as CSR arrays plus named per-node fields.

Constructors never recurse in Python, so a chain of any depth can be built."""
import copy
import os
import re

import numpy as np

from ..errors import InputError, checked_flag
from ..params import check_as_array, on_device, shape_and_dtype, to_host
from .linearizer import check_structure, first_bad_structure, native
from .vocabularies import Recent, pickled

KINDS = ("tree", "dag", "sequence")


class Forest:
    """Nodes 0..num_nodes-1; the children of node n are
    `child_idx[child_ptr[n]:child_ptr[n+1]]`, in order (left first). `fields`: arrays of a
    row per node; float fields may be GPU arrays (`__cuda_array_interface__`)."""

    def __init__(self, child_ptr, child_idx, roots, fields=None, kind="tree", vocab=None):
        if kind not in KINDS:
            raise InputError(f"Forest kind must be one of {KINDS}, not {kind!r}")
        self.child_ptr = _node_indices("child_ptr", child_ptr)
        self.child_idx = _node_indices("child_idx", child_idx)
        self.roots = _node_indices("roots", roots)
        if self.child_ptr.size == 0:
            raise InputError("child_ptr must be a 1-d array of num_nodes + 1 offsets")
        self.num_nodes = self.child_ptr.size - 1
        if fields is not None and not hasattr(fields, "items"):
            raise InputError(f"fields must be a dict of a name to an array with a row per node, "
                             f"not {type(fields).__name__}")
        self.fields = {name: _field(name, values, self.num_nodes)
                       for name, values in (fields or {}).items()}
        self.kind = kind
        self.vocab = vocab

    @property
    def labels(self):
        return self.fields.get("label")

    def __getstate__(self):
        """Its vocabularies as `vocabularies.Pickled`, made once while a dict keeps its words
        and loaded once a process: not a dict's pickle with every forest."""
        state = dict(self.__dict__)
        for name in _VOCABULARIES:
            if type(state.get(name)) is dict:
                state[name] = pickled(state[name])
        return state

    def __copy__(self):
        copied = Forest.__new__(Forest)
        copied.__dict__.update(self.__dict__)
        return copied

    def __deepcopy__(self, memo):
        copied = Forest.__new__(Forest)
        memo[id(self)] = copied
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    @property
    def device_fields(self):
        """The names of the fields that are GPU arrays."""
        return frozenset(name for name, values in self.fields.items() if on_device(values))

    def on_host(self):
        """This forest with every field a NumPy array: GPU fields copied to the host (the CPU
        backend and the reference read host memory)."""
        if self._all_on_host():
            return self
        forest = copy.copy(self)
        forest.fields = {name: to_host(values) for name, values in self.fields.items()}
        return forest

    @property
    def num_children(self):
        return np.diff(self.child_ptr)

    def children(self, n):
        return self.child_idx[self.child_ptr[n]:self.child_ptr[n + 1]]

    def __repr__(self):
        return (f"Forest(kind={self.kind!r}, num_nodes={self.num_nodes}, "
                f"num_roots={self.roots.size}, fields={sorted(self.fields)})")

    def select(self, trees):
        """The forest of some of these trees (or DAGs, or sequences): `trees` indexes `roots`
        (an int, a slice, indices or a boolean mask), as a dataset read once is cut into
        batches. The nodes the chosen roots reach keep their order, fields, kind and
        vocabulary; a node two chosen roots share is kept once."""
        self._require_host("select")
        check_structure(self)
        return self._select(trees)

    def _select(self, trees):
        """`select`, of a forest whose structure is checked already."""
        try:
            chosen = np.atleast_1d(self.roots[trees])
        except (IndexError, TypeError, ValueError) as error:
            raise InputError(f"Forest.select: {trees!r} does not index the forest's "
                             f"{self.roots.size} roots ({error})") from None
        reached = np.zeros(self.num_nodes, dtype=bool)
        frontier = np.unique(chosen)
        while frontier.size:
            reached[frontier] = True
            children = self.child_idx[_edges_of(self.child_ptr, frontier)]
            frontier = np.unique(children[~reached[children]])
        kept = np.flatnonzero(reached)
        new_of_old = np.full(self.num_nodes, -1, dtype=np.int64)
        new_of_old[kept] = np.arange(kept.size)
        counts = self.child_ptr[kept + 1] - self.child_ptr[kept]
        child_ptr = np.concatenate([[0], np.cumsum(counts)])
        child_idx = new_of_old[self.child_idx[_edges_of(self.child_ptr, kept)]]
        return Forest(child_ptr, child_idx, new_of_old[chosen],
                      {name: values[kept] for name, values in self.fields.items()},
                      self.kind, self.vocab)

    def batches(self, size, shuffle=False, seed=None, bucket_by_height=False, indices=False):
        """The forest's trees in batches of `size` (a forest each, `select`ed), for a pass over
        a corpus: in order, or in a random order (`shuffle`, reproducible with `seed`). With
        `bucket_by_height`, each batch holds trees of about one height, which makes fewer,
        fuller batches of nodes to run (the batches themselves shuffled, with `shuffle`). With
        `indices`, each comes as (its trees' positions in `roots`, the batch), so that what a
        batch computes goes back to the corpus's order. The `Batches` have a length, for a
        progress bar's total (`tqdm(forest.batches(256))`)."""
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise InputError(f"Forest.batches: size must be a whole number of trees, at least "
                             f"1, not {size!r}")
        shuffle = checked_flag("Forest.batches: shuffle", shuffle)
        bucket_by_height = checked_flag("Forest.batches: bucket_by_height", bucket_by_height)
        indices = checked_flag("Forest.batches: indices", indices)
        self._require_host("batches")
        check_structure(self)  # once, here: a check a batch read the whole corpus each time
        rng = _generator(seed)
        order = rng.permutation(self.roots.size) if shuffle else np.arange(self.roots.size)
        if bucket_by_height:
            order = order[np.argsort(self.root_heights()[order], kind="stable")]
        groups = [order[begin:begin + size] for begin in range(0, order.size, size)]
        if bucket_by_height and shuffle:
            groups = [groups[k] for k in rng.permutation(len(groups))]
        return Batches(self, groups, indices)

    def root_heights(self):
        """The height of each root's tree (a leaf's is 0), in the order of `roots`."""
        from .linearizer import linearize
        linearized = linearize(self, single_parent=self.kind != "dag")
        position = linearized.new_of_old[self.roots]
        batch = np.searchsorted(linearized.batch_begin, position, side="right") - 1
        return linearized.num_batches - 1 - batch

    @classmethod
    def concat(cls, forests):
        """One forest of the trees of several, in order: node n of the k-th forest becomes
        node n plus the nodes of the forests before it. They must share their kind, their
        fields' names and their vocabulary (a word id means one word)."""
        forests = list(forests)
        if not forests or not all(isinstance(f, Forest) for f in forests):
            raise InputError("Forest.concat takes a non-empty sequence of Forests")
        first = forests[0]
        names = sorted(first.fields)
        for index, forest in enumerate(forests):
            forest._require_host("concat")
            if index == 0:
                continue
            if forest.kind != first.kind:
                raise InputError(f"Forest.concat: forest {index} is of kind {forest.kind!r}, "
                                 f"forest 0 of kind {first.kind!r}")
            if sorted(forest.fields) != names:
                raise InputError(f"Forest.concat: forest {index} has fields "
                                 f"{sorted(forest.fields)}, forest 0 {names}")
            for name, values in forest.fields.items():
                ours, theirs = values, first.fields[name]
                if ours.shape[1:] != theirs.shape[1:] or ours.dtype.kind != theirs.dtype.kind:
                    raise InputError(f"Forest.concat: field {name!r} of forest {index} holds "
                                     f"{ours.dtype} rows of shape {ours.shape[1:]}, forest 0's "
                                     f"{theirs.dtype} rows of shape {theirs.shape[1:]}")
            if forest.vocab is not first.vocab and forest.vocab != first.vocab:
                raise InputError(f"Forest.concat: forest {index} has another vocabulary than "
                                 "forest 0, so its word ids mean other words: read them with "
                                 "one vocabulary (Forest.from_ptb(lines, vocab=...))")
        parts = [np.concatenate([getattr(f, name) for f in forests])
                 for name in ("child_ptr", "child_idx", "roots")]
        counts = [np.array([getattr(f, name).size for f in forests])
                  for name in ("child_ptr", "child_idx", "roots")]
        bounds = [np.concatenate(([0], np.cumsum(count))) for count in counts]
        bad = first_bad_structure(forests, *parts, bounds)
        if bad is not None:
            index, error = bad
            raise InputError(f"Forest.concat: forest {index}: {error}")
        child_ptr, child_idx, roots = parts
        nodes, edges = counts[0] - 1, counts[1]
        node_offsets = np.concatenate(([0], np.cumsum(nodes)[:-1]))
        edge_offsets = bounds[1][:-1]
        after_first = np.ones(child_ptr.size, dtype=bool)
        after_first[bounds[0][:-1]] = False  # each forest's leading 0
        return Forest(np.concatenate(([0], child_ptr[after_first]
                                      + np.repeat(edge_offsets, nodes))),
                      child_idx + np.repeat(node_offsets, edges),
                      roots + np.repeat(node_offsets, counts[2]),
                      {name: np.concatenate([f.fields[name] for f in forests])
                       for name in first.fields},
                      first.kind, first.vocab)

    def _all_on_host(self):
        """Whether every field is a NumPy array (told without asking each whether it is a GPU
        array: concat asks this of every forest it joins)."""
        return all(isinstance(values, np.ndarray) for values in self.fields.values())

    def _require_host(self, method):
        if not self._all_on_host() and self.device_fields:
            raise InputError(f"Forest.{method}: field {min(self.device_fields)!r} is a GPU "
                             "array; select or concatenate the host forest, then give it its "
                             "GPU fields")

    @classmethod
    def from_nested(cls, trees, leaf_field="word"):
        """Trees as nested tuples or lists whose leaves are ints (stored in `leaf_field`;
        -1 for internal nodes). Nodes are numbered in pre-order."""
        _require_field_name("leaf_field", leaf_field)
        builder = _Builder()
        roots = [builder.add_nested(tree) for tree in _iterable("from_nested", "trees", trees)]
        return builder.forest(roots, leaf_field, kind="tree")

    @classmethod
    def random_binary(cls, num_trees, seed=0, mean_leaves=19, vocab_size=1000):
        """Random full binary trees (random splits give SST-like heights), leaf words uniform
        in 0..vocab_size-1: a stand-in where the SST files are absent."""
        _require_count("num_trees", num_trees)
        _require_count("vocab_size", vocab_size, least=1)
        if not _is_real(mean_leaves) or not 0 <= mean_leaves <= MAX_MEAN_LEAVES:
            raise InputError(f"mean_leaves must be a number from 0 to {MAX_MEAN_LEAVES:g}, not "
                             f"{mean_leaves!r}")
        rng = _generator(seed)
        trees = []
        for _ in range(num_trees):
            leaves = max(1, int(rng.poisson(mean_leaves)))
            words = [int(w) for w in rng.integers(0, vocab_size, leaves)]
            trees.append(random_bracketing(words, rng))
        return cls.from_nested(trees)

    @classmethod
    def perfect(cls, height, num_trees=1, seed=0, vocab_size=1000):
        """Perfect binary trees of `height` (0: a single leaf), as TreeFC runs on; leaf words
        uniform in 0..vocab_size-1. Nodes are numbered level by level, root first."""
        _require_count("height", height)
        _require_count("num_trees", num_trees)
        _require_count("vocab_size", vocab_size, least=1)
        if height > 61:
            raise InputError(f"a perfect tree of height {height} would have 2**{height + 1} - 1 "
                             f"nodes, more than a forest indexes ({MAX_NODES})")
        _require_size(f"{num_trees} perfect trees of height {height}",
                      num_trees * (2 ** (height + 1) - 1))
        per_tree = 2 ** (height + 1) - 1
        internal = 2 ** height - 1
        offsets = np.arange(num_trees, dtype=np.int64)[:, None] * per_tree
        local_children = np.stack([2 * np.arange(internal) + 1, 2 * np.arange(internal) + 2], 1)
        child_idx = (local_children.reshape(1, -1) + offsets).reshape(-1)
        counts = np.tile(np.r_[np.full(internal, 2), np.zeros(per_tree - internal)], num_trees)
        child_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        words = np.full(num_trees * per_tree, -1, dtype=np.int64)
        is_leaf = counts == 0
        words[is_leaf] = _generator(seed).integers(0, vocab_size, is_leaf.sum())
        return cls(child_ptr, child_idx, offsets[:, 0], {"word": words}, kind="tree")

    @classmethod
    def grid_dag(cls, rows, cols, fields=None, num_grids=1):
        """DAG-RNN's grid: cell (i, j) is node `i * cols + j` (plus `g * rows * cols` for grid
        g) and its children are its left and upper neighbours, in that order; the root is the
        bottom-right cell. `fields` hold num_grids * rows * cols rows."""
        if not all(isinstance(n, (int, np.integer)) for n in (rows, cols, num_grids)) or \
                rows < 1 or cols < 1 or num_grids < 0:
            raise InputError(f"a grid needs whole numbers of rows and columns, at least one "
                             f"of each, and num_grids >= 0; not {rows!r}x{cols!r}, "
                             f"num_grids={num_grids!r}")
        cells = rows * cols
        _require_size(f"{num_grids} grids of {rows}x{cols}", cells * num_grids)
        i, j = np.divmod(np.arange(cells, dtype=np.int64), cols)
        counts = (j > 0).astype(np.int64) + (i > 0)
        left = np.where(j > 0, np.arange(cells) - 1, -1)
        up = np.where(i > 0, np.arange(cells) - cols, -1)
        pairs = np.stack([left, up], 1).reshape(-1)
        offsets = np.arange(num_grids, dtype=np.int64) * cells
        child_idx = (pairs[pairs >= 0][None, :] + offsets[:, None]).reshape(-1)
        counts = np.tile(counts, num_grids)
        child_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return cls(child_ptr, child_idx, offsets + cells - 1, fields, kind="dag")

    @classmethod
    def from_sequences(cls, lengths, fields=None):
        """Chains: step t of a sequence has one child, step t-1; the last step is the root.
        Sequence s occupies nodes `sum(lengths[:s]) ..` in step order, and so do `fields`."""
        takes = ("; from_sequences takes the sequences' lengths, their steps' values going in "
                 "fields, a row a step: from_sequences([3, 2], {'word': np.array([...])})")
        try:
            lengths = np.asarray(lengths)
        except ValueError:  # ragged lists: the sequences themselves, not their lengths
            raise InputError("sequence lengths must be a list of integers, not of sequences"
                             + takes) from None
        if lengths.size and lengths.dtype.kind not in "iu":
            raise InputError(f"sequence lengths must be integers, not {lengths.dtype}" + takes)
        if lengths.ndim != 1:
            raise InputError(f"sequence lengths must be a list, a length a sequence, not an "
                             f"array of shape {lengths.shape}" + takes)
        if lengths.size and (lengths.min() < 1 or lengths.max() > MAX_NODES):
            bad = int(np.flatnonzero((lengths < 1) | (lengths > MAX_NODES))[0])
            raise InputError(f"sequence {bad} has length {lengths[bad]}; every sequence needs a "
                             f"step, and at most {MAX_NODES}")
        lengths = lengths.astype(np.int64)
        _require_size(f"{lengths.size} sequences", int(lengths.sum(dtype=object)))
        starts = np.cumsum(lengths) - lengths
        num_nodes = int(lengths.sum())
        is_first = np.zeros(num_nodes, dtype=bool)
        is_first[starts] = True
        counts = (~is_first).astype(np.int64)
        child_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        child_idx = np.flatnonzero(~is_first) - 1
        return cls(child_ptr, child_idx, starts + lengths - 1, fields, kind="sequence")

    @classmethod
    def from_networkx(cls, graph, fields=(), kind=None):
        """A networkx DiGraph whose edges point the way data flows: an edge u → v makes u a
        child of v (v reads u's state), so the sinks are the roots. A node's children are in
        the order their edges to it were added (`graph.predecessors(v)`: `node.left` is the
        first), whatever the order of the nodes. Node attributes named in `fields` become
        fields; `.node_keys` lists the graph's nodes in recjit's order. `kind` defaults to
        "tree" when no node has two successors, else "dag"."""
        if not (hasattr(graph, "is_directed") and graph.is_directed()) or graph.is_multigraph():
            raise InputError(f"from_networkx takes a networkx DiGraph (edges point the way data "
                             f"flows, one edge a pair), not {type(graph).__name__}")
        keys = list(graph.nodes)
        index = {key: position for position, key in enumerate(keys)}
        edges = [(index[v], index[u]) for v in keys for u in graph.predecessors(v)]
        values = {}
        for name in (fields,) if isinstance(fields, str) else fields:
            missing = [key for key in keys if name not in graph.nodes[key]]
            if missing:
                raise InputError(f"networkx node {missing[0]!r} has no attribute {name!r}")
            shapes = {np.shape(graph.nodes[key][name]) for key in keys}
            if len(shapes) > 1:
                raise InputError(f"attribute {name!r} has shapes {sorted(shapes)} on different "
                                 "networkx nodes; a field has one shape a node")
            values[name] = np.asarray([graph.nodes[key][name] for key in keys])
        if kind is None:
            shared = any(graph.out_degree(key) > 1 for key in keys)
            kind = "dag" if shared else "tree"
        forest = cls.from_edges(len(keys), edges, values, kind)
        forest.node_keys = keys
        return forest

    @classmethod
    def from_ptb(cls, lines, vocab=None, labels=None):
        """Trees in PTB bracket format (`(label child child)`, `(label word)`): an iterable
        of lines (str or bytes, an open file), the whole text, or the path of a file as a
        `pathlib.Path` (read as UTF-8; a path as a plain str is refused, since a str is the
        text). SST's files hold a tree a line with numeric labels; a treebank's (the Penn
        Treebank's `.mrg`) spread a tree over lines, wrap it in an unlabelled bracket `( (S
        ...) )`, which makes no node, and label it with strings: pass `labels` (a dict, `{}`
        to start one) to read labels through it.

        Leaf words get ids from `vocab` (a dict, extended with unseen words); `.vocab` holds
        it, field `word` the ids (-1 inside), field `label` every node's label: the number, or
        its id in `labels` (extended, kept as `.label_vocab`)."""
        vocab = _vocabulary("vocab", "a word", "vocab", vocab)
        word_id = _id_in(vocab)
        label_id = _ptb_labels(_vocabulary("labels", "a label", "label_vocab", labels,
                                           new_if_none=False))
        if isinstance(lines, os.PathLike):
            lines = _text_of_file("from_ptb", lines)
        elif isinstance(lines, str) and "(" not in lines and os.path.isfile(lines):
            raise InputError(f"Forest.from_ptb: {lines!r} is the path of a file, not PTB text: "
                             "pass pathlib.Path(path) or open(path)")
        if isinstance(lines, (str, bytes)):  # the whole text, as `open(path).read()` gives it
            lines = lines.splitlines()
        builder = _Builder()
        roots = []
        for line_number, line in enumerate(_iterable("from_ptb", "lines", lines), 1):
            if isinstance(line, bytes):  # a file opened in binary mode
                try:
                    line = line.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise InputError(f"PTB line {line_number} is not UTF-8 ({error})") from None
            if not isinstance(line, str):
                raise InputError(f"PTB line {line_number} is a {type(line).__name__}, not text")
            if line_number == 1:  # a byte-order mark, as Windows editors save UTF-8 files
                line = line.removeprefix("\ufeff")
            roots += builder.add_ptb(line, line_number, word_id, label_id)
        if builder.open_nodes:
            raise InputError(f"PTB line {builder.tree_line}: unbalanced brackets (a tree "
                             "opened there is never closed)")
        forest = builder.forest(roots, "word", kind="tree")
        forest.fields["label"] = np.asarray(builder.labels, dtype=np.int64)
        forest.vocab = vocab
        if labels is not None:
            forest.label_vocab = labels
        return forest

    @classmethod
    def from_nltk(cls, trees, vocab=None, labels=None, collapse_unary=False, binarize=False):
        """`nltk.Tree`s (one, or an iterable): a preterminal `(NN cat)` is a leaf whose `word`
        is the word's id in `vocab` (a dict, extended with unseen words, kept as `.vocab`);
        every node's label (field `label`) is an id in `labels` (likewise, `.label_vocab`;
        -1 where a bare word among subtrees has none). `collapse_unary` joins chains of
        one-child nodes, down to a word's own node (their labels joined by '+'), `binarize`
        splits nodes of more than two children: nltk's own transformations, on a copy
        (`Tree.collapse_unary`, `Tree.chomsky_normal_form`); both give the full binary trees
        an `arity=2` model takes."""
        if hasattr(trees, "label") and callable(trees.label):
            trees = [trees]
        collapse_unary = checked_flag("Forest.from_nltk: collapse_unary", collapse_unary)
        binarize = checked_flag("Forest.from_nltk: binarize", binarize)
        vocab = _vocabulary("vocab", "a word", "vocab", vocab)
        labels = _vocabulary("labels", "a label", "label_vocab", labels)
        builder, roots = _Builder(), []
        for position, tree in enumerate(_iterable("from_nltk", "trees", trees)):
            if not _is_nltk_tree(tree):
                raise InputError(f"Forest.from_nltk: tree #{position} is a "
                                 f"{type(tree).__name__}, not an nltk.Tree")
            if collapse_unary or binarize:
                tree = _transformed(tree, position, collapse_unary, binarize)
            roots.append(builder.add_nltk(tree, _id_in(vocab), _id_in(labels)))
        if not roots:
            raise InputError("Forest.from_nltk: no trees")
        forest = builder.forest(roots, "word", kind="tree")
        forest.fields["label"] = np.asarray(builder.labels, dtype=np.int64)
        forest.vocab, forest.label_vocab = vocab, labels
        return forest

    @classmethod
    def from_edges(cls, num_nodes, edges, fields=None, kind="dag"):
        """Edges `(parent, child)`; a node's children keep the order of its edges. Roots are the
        nodes that are nobody's child."""
        _require_count("num_nodes", num_nodes)
        _require_size("the graph", num_nodes)
        edges = np.asarray(edges)
        if edges.size and edges.dtype.kind not in "iu":
            raise InputError(f"edges must hold integer node indices, not {edges.dtype}")
        if edges.size and (edges.ndim != 2 or edges.shape[1] != 2):
            raise InputError(f"edges must be (parent, child) pairs, an array of shape (E, 2), "
                             f"not {edges.shape}")
        edges = edges.astype(np.int64).reshape(-1, 2)
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


def _edges_of(child_ptr, nodes):
    """The positions in `child_idx` of the children of `nodes`, node after node."""
    begins = child_ptr[nodes]
    counts = child_ptr[nodes + 1] - begins
    first_of_node = np.cumsum(counts) - counts
    return np.repeat(begins - first_of_node, counts) + np.arange(counts.sum())


def random_bracketing(words, rng):
    """A random full binary tree (nested tuples) over `words`, built bottom-up without
    recursion: random adjacent pairs are joined until one tree remains."""
    items = list(words)
    while len(items) > 1:
        position = int(rng.integers(0, len(items) - 1))
        items[position:position + 2] = [(items[position], items[position + 1])]
    return items[0]


_PTB_TOKEN = re.compile(r"\(|\)|[^()]+")
_PTB_LABEL = re.compile(r"-?[0-9]+")
# The most nodes a forest may have: node indices, word ids and labels are int64, and so are
# the sums of counts the constructors take.
MAX_NODES = 2 ** 62
MAX_MEAN_LEAVES = 1e9


def _is_real(value):
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, bool) and np.isfinite(value)


def _generator(seed):
    """NumPy's random generator for `seed`, as `np.random.default_rng` takes it."""
    try:
        return np.random.default_rng(seed)
    except (TypeError, ValueError) as error:
        raise InputError(f"seed must be an int, a sequence of ints or None, not {seed!r} "
                         f"({error})") from None


def _text_of_file(method, path):
    """The text of the file at `path`, UTF-8; what stops reading it is an InputError."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as error:
        raise InputError(f"Forest.{method}: cannot read {os.fspath(path)!r} "
                         f"({error.strerror})") from None
    except UnicodeDecodeError as error:
        raise InputError(f"Forest.{method}: {os.fspath(path)!r} is not UTF-8 ({error})") from None


def _iterable(method, name, values):
    if not hasattr(values, "__iter__"):
        raise InputError(f"Forest.{method}: {name} must be an iterable, not "
                         f"{type(values).__name__} {values!r}")
    return values


def _require_size(what, num_nodes):
    if num_nodes > MAX_NODES:
        raise InputError(f"{what} would have {num_nodes} nodes, more than a forest indexes "
                         f"({MAX_NODES})")


def _require_field_name(argument, name):
    if not isinstance(name, str) or not name.isidentifier():
        raise InputError(f"{argument} must name a field as a cell reads it (node.word), not "
                         f"{name!r}")


def _require_count(name, value, least=0):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
        raise InputError(f"{name} must be an int >= {least}, not {value!r}")


def _node_indices(name, values):
    """A structure array as 1-d int64; a non-integer one is refused rather than truncated."""
    values = np.asarray(values)
    if values.size and values.dtype.kind not in "iu":
        raise InputError(f"{name} must hold integers (node indices and offsets), not "
                         f"{values.dtype}")
    if values.ndim != 1:
        raise InputError(f"{name} must be a 1-d array, not one of shape {values.shape}")
    return np.ascontiguousarray(values, dtype=np.int64)


def _field(name, values, num_nodes):
    """A field as a forest keeps it: a contiguous NumPy array in the machine's byte order, or a
    float array on the GPU as it is, which a CUDA run reorders on the device instead of copying
    it to the host and back."""
    _require_field_name("a field's name", name)
    if on_device(values):
        shape, dtype = shape_and_dtype(values)
        if dtype.kind != "f":
            raise InputError(f"field {name!r} is a {dtype} array on the GPU; only float fields "
                             "may stay there (recjit checks every index a field holds on the "
                             "host, before a kernel runs)")
    else:
        check_as_array(f"field {name!r}", values,
                       differentiated="give it in rj.torch.apply's (or Module's) fields=")
        values = native(np.ascontiguousarray(values))
        shape = values.shape
    if len(shape) == 0 or shape[0] != num_nodes:
        raise InputError(f"field {name!r} has shape {tuple(shape)}; "
                         f"its first dimension must be num_nodes = {num_nodes}")
    return values


def _ptb_labels(labels):
    """`label_id(label, line_number)`: a PTB label as the number it is (`labels` None), or as
    its id in the vocabulary `labels`."""
    if labels is None:
        numbers = {}  # each label text met, as its number: a treebank has a handful

        def label_id(label, line_number):
            number = numbers.get(label)
            if number is None:
                if not _PTB_LABEL.fullmatch(label) or abs(int(label)) > MAX_NODES:
                    raise InputError(f"PTB line {line_number}: expected a label after '(', "
                                     f"an int64, got {label!r} (string labels are read with "
                                     "labels={})")
                number = numbers[label] = int(label)
            return number
        return label_id
    named = _id_in(labels)

    def label_id(label, line_number):
        if not label:
            raise InputError(f"PTB line {line_number}: expected a label after '('")
        return named(label)
    return label_id


def _transformed(tree, position, collapse_unary, binarize):
    """A copy of `tree` through nltk's own transformations, its labels made strings first, as
    the forest keeps them (nltk joins them with '+'). nltk recurses through a tree: one too
    deep for Python's stack is refused by name."""
    try:
        tree = tree.copy(deep=True)
        for subtree in tree.subtrees():
            subtree.set_label(str(subtree.label()))
        if collapse_unary:
            tree.collapse_unary(collapsePOS=True, collapseRoot=True)
        if binarize:
            tree.chomsky_normal_form()
    except RecursionError:
        asked = " and ".join(name for name, wanted in (("collapse_unary", collapse_unary),
                                                        ("binarize", binarize)) if wanted)
        raise InputError(f"Forest.from_nltk: tree #{position} is too deep for {asked}, whose "
                         f"nltk transformations recurse: read it without them, or raise "
                         f"sys.setrecursionlimit") from None
    return tree


def _is_nltk_tree(value):
    """Whether `value` is an nltk.Tree (a list with a `label()`), told without importing nltk."""
    return isinstance(value, list) and callable(getattr(value, "label", None))


# The dicts readers extended last, each with its next id: a corpus read a tree a call
# (`Forest.from_ptb([line], vocab=vocab)` in a loop) then neither checks every id nor looks
# for the largest at each call, which scanned the whole vocabulary: reading was quadratic.
_readers = Recent()


def _vocabulary(name, what, kept_as, vocabulary, new_if_none=True):
    """`vocabulary` checked: a dict of `what` to its id, a non-negative int, as a forest read
    before keeps it (its attribute `kept_as`); None is a new one (or, unless `new_if_none`,
    stays None). One a reader left as it is (`_readers`) is not checked again."""
    if vocabulary is None:
        return {} if new_if_none else None
    if _readers.find(id(vocabulary), vocabulary) is not None:
        return vocabulary
    if not isinstance(vocabulary, dict) or not all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) and 0 <= i <= MAX_NODES
            for i in vocabulary.values()):
        raise InputError(f"{name} must be a dict of {what} to its id, a non-negative int (the "
                         f".{kept_as} of a forest read before), not {type(vocabulary).__name__}")
    return vocabulary


def _id_in(vocabulary):
    """A function giving each key its id in `vocabulary`, a new one for a new key: one past
    the largest id, found once (a key a time, it made reading a corpus quadratic), or known
    from the last reader that extended it (`_readers`)."""
    next_id = _readers.find(id(vocabulary), vocabulary)
    if next_id is None:
        next_id = max(vocabulary.values(), default=-1) + 1
        _readers.enter(id(vocabulary), vocabulary, next_id)

    def identify(key):
        nonlocal next_id
        if key not in vocabulary:
            vocabulary[key] = next_id
            next_id += 1
            _readers.enter(id(vocabulary), vocabulary, next_id)
        return vocabulary[key]
    return identify


class Batches:
    """A pass over a forest in batches (`Forest.batches`): each batch is selected as it is
    reached; `len` is their number. Each pass over it takes the same batches."""

    def __init__(self, forest, groups, indices):
        self.forest, self.groups, self.indices = forest, groups, indices

    def __len__(self):
        return len(self.groups)

    def __repr__(self):
        largest = max((len(group) for group in self.groups), default=0)
        return f"Batches({len(self.groups)} of up to {largest} trees)"

    def __iter__(self):
        for group in self.groups:
            batch = self.forest._select(group)
            yield (group, batch) if self.indices else batch


_VOCABULARIES = ("vocab", "label_vocab")  # the attributes a reader keeps its dicts in


class _Builder:
    """Accumulates nodes in pre-order with explicit stacks (no Python recursion)."""

    def __init__(self):
        self.children = []
        self.leaf_values = []
        self.labels = []
        self.open_nodes = []  # PTB brackets open across lines (None: an outer, unlabelled one)
        self.tree_root = None
        self.tree_line = None

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
                if not -MAX_NODES <= subtree <= MAX_NODES:
                    raise InputError(f"leaf {int(subtree)} is outside the int64 values a "
                                     "field holds")
                node = self.new_node(int(subtree))
            else:
                raise InputError(f"a nested-tuple leaf must be an int, not {subtree!r}")
            if parent is None:
                root = node
            else:
                self.children[parent].append(node)
        return root

    def add_nltk(self, tree, word_id, label_id):
        """An nltk.Tree's nodes, parents first; a preterminal is one leaf node."""
        root = None
        stack = [(tree, None, None)]  # (a subtree, its parent's node, its parent's label)
        while stack:
            subtree, parent, parent_label = stack.pop()
            if isinstance(subtree, str):  # a bare word among subtrees: a leaf, no label
                node = self.new_node(word_id(subtree))
            elif not _is_nltk_tree(subtree):
                raise InputError(f"Forest.from_nltk: node ({parent_label}) has a child "
                                 f"{subtree!r} ({type(subtree).__name__}), neither a subtree "
                                 "nor a word")
            elif len(subtree) == 1 and isinstance(subtree[0], str):  # (NN cat)
                node = self.new_node(word_id(subtree[0]), label_id(str(subtree.label())))
            elif len(subtree) == 0:
                raise InputError(f"Forest.from_nltk: node ({subtree.label()}) has no children "
                                 "and no word")
            else:
                node = self.new_node(label=label_id(str(subtree.label())))
                stack.extend((child, node, subtree.label()) for child in reversed(subtree))
            if parent is None:
                root = node
            else:
                self.children[parent].append(node)
        return root

    def add_ptb(self, line, line_number, word_id, label_id):
        """Read one line of PTB brackets; the roots of the trees it completes. A tree may span
        lines (`self.open_nodes` holds the open brackets between calls), but two trees do not
        share one. A treebank's outer unlabelled bracket, `( (S ...) )`, makes no node."""
        completed = []
        tokens = _PTB_TOKEN.findall(line)
        position = 0
        while position < len(tokens):
            token = tokens[position]
            if token == "(":
                following = tokens[position + 1] if position + 1 < len(tokens) else ""
                label_and_word = "" if following in "()" else following
                if not self.open_nodes and completed:
                    raise InputError(f"PTB line {line_number}: more than one tree on the line")
                if not self.open_nodes:
                    self.tree_line = line_number
                if not label_and_word.strip() and not self.open_nodes and following:
                    self.open_nodes.append(None)  # the treebank's outer bracket
                    position += 1 if following in "()" else 2
                    continue
                label, _, word = label_and_word.strip().partition(" ")
                word = word.strip()  # one word, which SST's may have spaces in ("8 1\/2")
                node = self.new_node(label=label_id(label, line_number))
                # the innermost open node; None only for a treebank's outer bracket, which
                # is the bottom of the stack
                parent = self.open_nodes[-1] if self.open_nodes else None
                if parent is not None:
                    if self.leaf_values[parent] >= 0:
                        raise InputError(f"PTB line {line_number}: the subtree "
                                         f"'({label_and_word.strip()}' follows a word in its "
                                         f"parent's bracket; a node holds one word or "
                                         f"subtrees, not both")
                    self.children[parent].append(node)
                else:
                    self.tree_root = node
                self.open_nodes.append(node)
                if word:
                    self.leaf_values[node] = word_id(word)
                position += 2
            elif token == ")":
                if not self.open_nodes:
                    raise InputError(f"PTB line {line_number}: unbalanced ')'")
                closed = self.open_nodes.pop()
                if closed is not None and not self.children[closed] and \
                        self.leaf_values[closed] < 0:
                    raise InputError(f"PTB line {line_number}: a bracket holds a label and "
                                     "neither a word nor subtrees")
                if not self.open_nodes:
                    if self.tree_root is None:
                        raise InputError(f"PTB line {line_number}: an empty tree")
                    completed.append(self.tree_root)
                    self.tree_root = None
                position += 1
            elif token.strip():
                raise InputError(f"PTB line {line_number}: unexpected text {token.strip()!r}")
            else:
                position += 1
        return completed

    def forest(self, roots, leaf_field, kind):
        counts = np.fromiter((len(c) for c in self.children), dtype=np.int64,
                             count=len(self.children))
        child_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        child_idx = np.fromiter((c for cs in self.children for c in cs), dtype=np.int64,
                                count=int(child_ptr[-1]))
        fields = {leaf_field: np.asarray(self.leaf_values, dtype=np.int64)}
        return Forest(child_ptr, child_idx, roots, fields, kind)
