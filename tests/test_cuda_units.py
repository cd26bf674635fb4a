"""Which products split their rows by hidden units and which barriers become a block's
(`codegen_cuda/units.py`), and which arrays a parallel loop launched on its own takes
(`codegen_cuda.emit.free_names`), on small ILIR kernels written by hand: no kernel is
compiled."""
from recjit.codegen_cuda.emit import free_names
from recjit.codegen_cuda.units import split_units
from recjit.lowering.ilir import (Barrier, BinOp, Const, If, Kernel, Let, Load, Loop, LoopRole,
                                  MatMul, Store, Var)

UNITS = 4
WEIGHTS = {"p_U": (3 * UNITS, UNITS), "p_V": (UNITS + 1, UNITS)}


def elementwise(array, column, written="state_0"):
    """A parallel loop over a batch's nodes storing `array[node, column]` at each element e."""
    element = Loop("e", Const(0), Const(UNITS), (
        Store(written, (Var("node"), Var("e")), Load(array, (Var("node"), column))),),
        LoopRole.ELEMENTS)
    return Loop("slot", Const(0), Var("count"), (Let("node", Var("slot")), element),
                LoopRole.NODES)


def product(x="state_0", y="proj", weight="p_U"):
    return MatMul(weight, x, y, Var("count"), 32)


def kernel(*body):
    return Kernel("k_kernel", "float64", ("count",), (), (("state_0", UNITS),), tuple(body))


def block_barriers(split, body):
    """The barriers of `body` (`Statements`, the kernel's or a loop's in it) that are a
    block's."""
    return [index for index, statement in enumerate(body)
            if isinstance(statement, Barrier) and split.block_barrier(body, index)]


def test_gate_rows_read_at_their_own_unit_split_by_units_and_need_a_block_barrier_only():
    gate = BinOp("+", Var("e"), Const(2 * UNITS))
    body = (elementwise("field_x", Var("e")), Barrier("states"), product(), Barrier("products"),
            elementwise("proj", gate))
    split = split_units(kernel(*body), WEIGHTS)
    assert split.arrays == {"proj": UNITS} and split.weights == {"p_U": UNITS}
    assert block_barriers(split, split.kernel_body) == [3]


def test_a_row_read_at_another_unit_keeps_the_grid_barrier():
    body = (elementwise("field_x", Var("e")), Barrier("states"), product(), Barrier("products"),
            elementwise("proj", BinOp("+", Var("e"), Const(1))))
    split = split_units(kernel(*body), WEIGHTS)
    assert split.arrays == {} and block_barriers(split, split.kernel_body) == []


def test_a_weight_whose_rows_are_no_multiple_of_the_units_keeps_the_grid_barrier():
    body = (elementwise("field_x", Var("e")), Barrier("states"), product(weight="p_V"),
            Barrier("products"), elementwise("proj", Var("e")))
    split = split_units(kernel(*body), WEIGHTS)
    assert split.arrays == {} and block_barriers(split, split.kernel_body) == []


def test_inputs_rewritten_before_the_grid_meets_again_keep_the_grid_barrier():
    """A block past the barrier would pack the next inputs while others still multiply."""
    body = (elementwise("field_x", Var("e"), "packed"), Barrier("packed"),
            product(x="packed"), Barrier("products"), elementwise("proj", Var("e")),
            elementwise("field_x", Var("e"), "packed"))
    split = split_units(kernel(*body), WEIGHTS)
    assert block_barriers(split, split.kernel_body) == []


def test_inputs_rewritten_only_after_a_grid_barrier_need_a_block_barrier_only():
    body = (elementwise("field_x", Var("e"), "packed"), Barrier("packed"),
            product(x="packed"), Barrier("products"), elementwise("proj", Var("e")),
            Barrier("states"), elementwise("field_x", Var("e"), "packed"))
    split = split_units(kernel(*body), WEIGHTS)
    assert block_barriers(split, split.kernel_body) == [3]


def test_a_batch_loop_that_packs_again_in_its_next_batch_keeps_the_grid_barrier():
    batch = (elementwise("field_x", Var("e"), "packed"), Barrier("packed"),
             product(x="packed"), Barrier("products"), elementwise("proj", Var("e")))
    loop = Loop("b", Var("count"), Const(-1), batch, LoopRole.BATCHES, step=-1)
    split = split_units(kernel(loop), WEIGHTS)
    assert block_barriers(split, split.kernel_body.inner(0)) == []


def test_a_batch_loop_that_packs_again_only_after_the_grid_meets_needs_a_block_barrier_only():
    """`if b > 0:` at the end of the batch loop is skipped in the last batch only, after
    which nothing packs again."""
    batch = (elementwise("field_x", Var("e"), "packed"), Barrier("packed"),
             product(x="packed"), Barrier("products"), elementwise("proj", Var("e")),
             If(BinOp(">", Var("b"), Const(0)), (Barrier("states"),)))
    loop = Loop("b", Var("count"), Const(-1), batch, LoopRole.BATCHES, step=-1)
    split = split_units(kernel(loop), WEIGHTS)
    assert block_barriers(split, split.kernel_body.inner(0)) == [3]


def test_a_loop_launched_on_its_own_takes_what_a_branch_inside_it_reads():
    def copy(source, target):
        return (Store(target, (Var("node"), Const(0)), Load(source, (Var("node"), Const(0)))),)

    branch = If(BinOp(">", Var("count"), Const(4)), copy("field_x", "state_0"),
                copy("field_y", "state_1"))
    loop = Loop("slot", Const(0), Var("count"), (Let("node", Var("slot")), branch), LoopRole.NODES)
    assert free_names(loop) == ["count", "state_0", "field_x", "state_1", "field_y"]
