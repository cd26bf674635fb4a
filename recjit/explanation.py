"""What `explain()` returns, and the lines it writes about the compiled kernels."""
import html

import numpy as np

from .lowering.arguments import weight_shapes
from .lowering.backward import gradient_sums
from .lowering.traffic import batch_traffic
from .params import shape_and_dtype


class Explanation(str):
    """The text of `explain()`: a `str`, shown as the text itself where a value is shown (a
    notebook cell's last line, the REPL), once, and as a preformatted block in Jupyter's HTML
    view."""

    def __repr__(self):
        return str(self)

    def _repr_html_(self):
        return f"<pre>{html.escape(str(self))}</pre>"


def remat_line(kept):
    """What `explain(grad=True)` says of the products the forward keeps for the backward
    (`Kernel.kept`)."""
    if not kept:
        return ("remat: the backward recomputes each node's products from its children's "
                "states or its fields (Schedule(remat=True), or a refactored or unrolled one)")
    arrays = ", ".join(dict.fromkeys(product.array for product in kept))
    tables = ", ".join(f"`{table}`" for table in dict.fromkeys(
        product.gathered[0] for product in kept if product.gathered))
    gathered = (f", and the rows its leaves gathered from {tables}, so that the backward reads "
                "no table" if tables else "")
    return (f"remat: the forward keeps each node's products for the backward ({arrays}: a "
            "row per internal node or edge, or per distinct key of the leaves)" + gathered
            + ", which it reads instead of recomputing them (Schedule(remat=True) recomputes)")


def backward_line(backward, backend):
    """What `explain(grad=True)` says of how the backward runs on `backend`: `backward`, its
    compiled kernel, or None where the adjoint is interpreted."""
    if backward is None:
        return ("the backward is interpreted: NumPy evaluates the adjoint a batch at a time "
                "(the backward lowering does not take one of the cell's constructs yet)")
    key = backward.kernel.group_key
    grouped = (f"; the leaves' rows are summed by `{key}` (by tree and `{key}` for per-tree "
               "gradients) before their products and gradients, once a group" if key else "")
    if backend == "cpu":
        reordered = ("; a node's per-child work runs after its own values, child by child "
                     "with the elements innermost (`vals_...` rows)"
                     if backward.children_after else "")
        sums = "; it sums each bias's rows at its end" if gradient_sums(backward.kernel) else ""
        return ("the backward is one call of the numba parallel kernel above" + reordered
                + grouped + sums + "; the host then multiplies each weight's rows (Σ a ⊗ b as "
                "one product over the nodes, with the kernels' own products) and sums a "
                "table's gathered rows by row (per tree, every gradient's rows tree by tree)")
    return (f"the backward is the kernel above on the GPU ({backward.describe()})" + grouped
            + "; the host sums the rows of the other gradients, and every weight's rows for "
            "per-tree gradients")


def outside_line(analysis):
    """What `explain` says of the names the cell reads from outside its body: every run checks
    them, and compiles again where one changed. Numbers and lists are shown with their
    values."""
    outside = analysis.usage.outside
    shown = []
    for name, value in zip(outside.names, outside.values()):
        constant = isinstance(value, (int, float, str, tuple, list))
        shown.append(str(name) + (f" = {value!r}" if constant else ""))
    return ("names read from outside the cell (a run compiles again where one changed): "
            + (", ".join(shown) if shown else "none"))


def traffic_line(compiled, p, batch_sizes):
    """What `explain` says of the bytes an internal batch moves (an estimate from the ILIR)."""
    shapes = weight_shapes({name: shape_and_dtype(getattr(p, name))[0]
                            for name in compiled.cell.parameters})
    itemsize = np.dtype(compiled.cell.dtype).itemsize
    weights, per_node = batch_traffic(compiled.kernel, shapes, itemsize)
    mean = float(np.mean(batch_sizes)) if batch_sizes.size else 0.0
    return (f"bytes moved per internal batch (estimated): {weights / 1024:.1f} KiB of weights "
            f"+ {per_node / 1024:.2f} KiB per node (states, children's states, products' "
            f"inputs and outputs; scratch indexed densely by slot); this forest's mean batch "
            f"of {mean:.1f} nodes moves {(weights + mean * per_node) / 1024:.1f} KiB")
