"""The cell IR: one list of tensor operations per structural case of the cell function.

Values are SSA: operation i defines `%i`. Shapes are concrete, inferred from the actual
parameters and fields. Op kinds and their `attrs`:

  param        (name,)              a parameter array; `W.T`: parameter W read transposed
  child_state  (child, component)   component of child k's state (the recursive call's result);
                                    child "each": of any one child, with a variable arity
  child_sum    ()                   the sum over the node's children of a per-child value
  child_max    (ties,)              the maximum over the node's children of a per-child value,
                                    NumPy's `maximum` taken child by child from -inf; `ties`
                                    "earliest" (the running value is `maximum`'s first operand,
                                    which wins a tie) or "latest"; `child_min` the same from inf
  child_position ()                 a child's place among its node's children (0, 1, ...), a
                                    number per child: what `enumerate(node.children)` counts
  gather       (table, field)       row `table[node.field]` of a parameter table
  field        (name,)              the node's own vector field
  const        (value,)             a scalar; `fill` (value,) the same broadcast to `shape`
  unary        (function,)          tanh sigmoid relu exp log sqrt neg abs
  binary       (function,)          add sub mul div maximum minimum; scalars broadcast
  matvec       ()                   matrix @ vector; `matmul` matrix @ matrix; `inner` vector
                                    @ vector, a number
  slice        (start, stop)        elements start..stop of a vector
  concat       ()                   vectors joined end to end, or matrices stacked as rows

An op is `per_child` when it reads `child_state each`: it has one value per child, and only a
reduction over the children (`OVER_CHILDREN`) turns it back into a value of the node.
"""
from dataclasses import dataclass

EACH = "each"  # `child_state` of any one child, with a variable arity
OVER_CHILDREN = ("child_sum", "child_max", "child_min")  # a per-child value → the node's
TRANSPOSED = ".T"  # a `param` op's name ends with it where the cell reads the matrix transposed


def transposed(name):
    """The `param` name of parameter `name` read transposed (`W` ↔ `W.T`)."""
    return name.removesuffix(TRANSPOSED) if name.endswith(TRANSPOSED) else name + TRANSPOSED


def attribute(name):
    """The attribute of the parameters that `param` name `name` reads: `W` for `W.T` too."""
    return name.removesuffix(TRANSPOSED)


def label(name):
    """`param` name `name` as a part of generated names (`x_W`, `proj_W_T_0`): `W.T` is
    `W_T`, which the frontend keeps from meeting a parameter of that name."""
    return name.replace(TRANSPOSED, "_T")


@dataclass(frozen=True)
class Op:
    kind: str
    args: tuple
    attrs: tuple
    shape: tuple
    line: int
    per_child: bool = False

    @property
    def size(self):
        size = 1
        for extent in self.shape:
            size *= extent
        return size


@dataclass(frozen=True)
class CellCase:
    """The cell specialised to one structural case: a leaf, or an internal node with
    `num_children` children (None: any number, the arity=None models)."""

    name: str
    num_children: int
    ops: tuple
    outputs: tuple

    def read_by_states(self):
        """The ops a returned state reads, directly or through others: what the forward
        kernel computes. The others stay in the list, numbered as the kernels' names are
        (`v7` is `%7`): the simplifications left them behind (`W @ 0` folded to zeros
        leaves `W`)."""
        read, pending = set(), list(self.outputs)
        while pending:
            index = pending.pop()
            if index not in read:
                read.add(index)
                pending.extend(self.ops[index].args)
        return read

    def __str__(self):
        count = "any number of" if self.num_children is None else self.num_children
        lines = [f"case {self.name} ({count} children):"]
        read = self.read_by_states()
        for index, op in enumerate(self.ops):
            operands = ", ".join(f"%{a}" for a in op.args)
            attrs = ", ".join(str(a) for a in op.attrs)
            text = ", ".join(t for t in (attrs, operands) if t)
            per_child = "  per child" if op.per_child else ""
            unread = "" if index in read else "  (no state reads it)"
            lines.append(f"  %{index} = {op.kind} {text}".rstrip() + f"    : {op.shape}"
                         + per_child + unread)
        lines.append("  return " + ", ".join(f"%{o}" for o in self.outputs))
        return "\n".join(lines)


@dataclass(frozen=True)
class CellIR:
    name: str
    cases: tuple
    state_shapes: tuple
    state_is_tuple: bool
    dtype: str
    parameters: dict  # name -> shape
    fields: dict      # name -> (per-node shape, dtype)
    gathers: tuple    # (case name, table, field): indices to validate before running
    filename: str
    outside: object   # what the build read from outside the cell (`names.Captured`)

    def case(self, name):
        return next(case for case in self.cases if case.name == name)

    def only_gathered(self):
        """The parameters the cell reads only by gathering rows (`p.E[node.word]`), never
        whole: their gradient is a `RowGrad`."""
        whole = {attribute(op.attrs[0]) for case in self.cases for op in case.ops
                 if op.kind == "param"}
        return {table for _, table, _ in self.gathers} - whole

    def __str__(self):
        return "\n".join(str(case) for case in self.cases)
