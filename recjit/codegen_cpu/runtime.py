"""Hand-tuned building blocks that generated CPU kernels call.

`matmul_rows` is every matrix-vector product of one weight in one pass. Nodes are the outer
loop: a block's inputs stay in L1 while its weight rows stream from L2 (with the rows outer, a
large level re-read its inputs from L3 for every pair of rows). Each pass over the rows uses
one register block (`dot_block`), chosen by measurement (benchmarks/README.md, "Measurements
behind the code"):
- 6 nodes × 2 weight rows: per 8 columns 2 weight and 6 input vectors for 12 multiply-adds,
  where 4×3 ran slower and 3×4 or 2×6 spill registers;
- the last 1–5 nodes in one pass: 5×2, 4×2, 3×2, and 2×4 and 1×4, which read a weight row
  for fewer nodes and so take more rows at once.

The blocks are LLVM vector IR (a numba intrinsic), not numba code. From a scalar dot product,
LLVM vectorizes the k loop and then ends each of the block's accumulators with a horizontal
sum of its own, six shuffles and adds per output, 72 for the 6×2 block. Here the accumulators
are explicit vectors of `VECTOR_BYTES` (one register: 16 float32 lanes with AVX-512, 8 with
AVX2) and one transposing tree sums as many of them together as they have lanes, each merge two
shuffles and an add.

`matmul_share`, every product of the batch loop and of the hoisted leaves, multiplies through
the weight's *panels* when the run packed them: the weight transposed once per run in panels
of two vectors' worth of rows (`pack_share`), so that an outer-product block (`outer_block`)
reads one panel row per column as two vectors, broadcasts each node's input, and keeps
vectors of outputs that it stores as they are: no sums across lanes, about a quarter faster
than the dot blocks from 4 nodes up. Panels that are rows as they lie (a weight gradient's)
are walked 64 of their rows at a time, which then stay in L1 (`PANEL_DEPTH`). Packing costs
about one read and one write of every weight, more than it saves below about 64 nodes, so
small forests read the weights as they are (`Schedule.pack_from_nodes`)."""
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.core.registry import cpu_target
from numba.extending import intrinsic
from numpy.lib.stride_tricks import as_strided


def target_vector_bytes(features):
    """The bytes of one vector register of the CPU numba compiles for, from its LLVM feature
    string (`+avx512f,...`): 64 with AVX-512, else 32 (AVX2's; LLVM splits it where the CPU
    has less). Numba's disk cache is keyed by the same features, so a kernel compiled for one
    width is never loaded where the other is used."""
    return 64 if "+avx512f" in features.split(",") else 32


# Every block's vectors, and a panel's width (two of them): AVX-512's where the CPU has it,
# measured faster (benchmarks/README.md, "Measurements behind the code");
# `NUMBA_CPU_FEATURES=-avx512f` opts out.
VECTOR_BYTES = target_vector_bytes(cpu_target.target_context.codegen().magic_tuple()[2])
_FAST = ("fast",)


def dot_block(nodes, rows):
    """An intrinsic `block(weight, x, y, s, r, columns, added)`: for i < nodes and j < rows,
    y[s + i, r + j] = Σ_k weight[r + j, k] · x[s + i, k] over k < columns; `added`, y plus
    those sums."""

    @intrinsic
    def block(typingctx, weight, x, y, s, r, columns, added):
        arrays = (weight, x, y)
        if not all(isinstance(a, types.Array) and a.ndim == 2 and a.dtype == y.dtype
                   for a in arrays) or y.dtype not in (types.float32, types.float64):
            raise TypingError(f"dot_block needs three 2-d float32 or float64 arrays of one "
                              f"dtype, not {arrays}")

        def codegen(context, builder, signature, args):
            weight_array, x_array, y_array = (
                context.make_array(t)(context, builder, v)
                for t, v in zip(signature.args[:3], args[:3]))
            s, r, columns, added = args[3:]
            _Block(context, builder, signature.args[2].dtype, nodes, rows).emit(
                weight_array, x_array, y_array, s, r, columns, added)
            return context.get_dummy_value()

        return types.void(weight, x, y, s, r, columns, types.boolean), codegen

    block.__name__ = f"dot_block_{nodes}x{rows}"
    return block


class _Block:
    """The IR of one block: a vector loop over k, the transposing sums, a scalar loop over the
    last columns % lanes, the stores."""

    def __init__(self, context, builder, dtype, nodes, rows):
        self.builder = builder
        self.nodes, self.rows = nodes, rows
        self.intp = context.get_value_type(types.intp)
        self.element = context.get_data_type(dtype)
        self.element_bytes = dtype.bitwidth // 8
        self.lanes = VECTOR_BYTES // self.element_bytes
        self.vector = ir.VectorType(self.element, self.lanes)

    def emit(self, weight_array, x_array, y_array, s, r, columns, added):
        builder, intp = self.builder, self.intp
        weight, x, y = (_Strided(builder, intp, a) for a in (weight_array, x_array, y_array))
        weight_rows = [weight.row(builder.add(r, intp(j))) for j in range(self.rows)]
        x_rows = [x.row(builder.add(s, intp(i))) for i in range(self.nodes)]
        y_rows = [y.row(builder.add(s, intp(i))) for i in range(self.nodes)]
        pairs = [(i, j) for i in range(self.nodes) for j in range(self.rows)]

        # Vector loads need each row's elements adjacent, as in every array generated code
        # passes (C-contiguous, or a slice of one with step 1); any other stride takes the
        # scalar loop for every column.
        adjacent = builder.and_(
            builder.icmp_signed("==", weight.column_stride, intp(self.element_bytes)),
            builder.icmp_signed("==", x.column_stride, intp(self.element_bytes)))
        vector_end = builder.select(
            adjacent, builder.sub(columns, builder.srem(columns, intp(self.lanes))), intp(0))
        zero = ir.Constant(self.vector, [ir.Constant(self.element, 0.0)] * self.lanes)
        accumulators = [cgutils.alloca_once_value(builder, zero) for _ in pairs]
        with cgutils.for_range_slice(builder, intp(0), vector_end, intp(self.lanes), intp) \
                as (k, _):
            offset = builder.mul(k, intp(self.element_bytes))
            weights = [self.load(builder.add(row, offset), self.vector) for row in weight_rows]
            xs = [self.load(builder.add(row, offset), self.vector) for row in x_rows]
            for accumulator, (i, j) in zip(accumulators, pairs):
                self.multiply_add(accumulator, weights[j], xs[i])

        sums = self.lane_sums([builder.load(a) for a in accumulators])
        totals = [cgutils.alloca_once_value(builder, total) for total in sums]
        with cgutils.for_range_slice(builder, vector_end, columns, intp(1), intp) as (k, _):
            weights = [self.load(weight.at(row, k), self.element) for row in weight_rows]
            xs = [self.load(x.at(row, k), self.element) for row in x_rows]
            for total, (i, j) in zip(totals, pairs):
                self.multiply_add(total, weights[j], xs[i])

        outputs = [builder.inttoptr(y.at(y_rows[i], builder.add(r, intp(j))),
                                    self.element.as_pointer()) for i, j in pairs]
        self.store([builder.load(total) for total in totals], outputs, added)

    def store(self, values, outputs, added):
        """Each value into its output; `added` (an i1), added to what the output holds."""
        builder = self.builder
        with builder.if_else(added) as (adding, storing):
            with adding:
                for value, output in zip(values, outputs):
                    builder.store(builder.fadd(builder.load(output, align=self.element_bytes),
                                               value, flags=_FAST),
                                  output, align=self.element_bytes)
            with storing:
                for value, output in zip(values, outputs):
                    builder.store(value, output, align=self.element_bytes)

    def load(self, address, value_type):
        pointer = self.builder.inttoptr(address, value_type.as_pointer())
        return self.builder.load(pointer, align=self.element_bytes)

    def multiply_add(self, accumulator, a, b):
        builder = self.builder
        product = builder.fmul(a, b, flags=_FAST)
        builder.store(builder.fadd(builder.load(accumulator), product, flags=_FAST), accumulator)

    def lane_sums(self, vectors):
        """Each vector's sum of lanes, in order: groups of up to `lanes` vectors (a power of
        two) each go through one transposing tree."""
        sums = []
        while len(sums) < len(vectors):
            left = len(vectors) - len(sums)
            group = min(1 << (left.bit_length() - 1), self.lanes)
            sums += self.transposed_sums(vectors[len(sums):len(sums) + group])
        return sums

    def transposed_sums(self, vectors):
        """Sums of `len(vectors)` (a power of two, at most `lanes`) vectors' lanes.

        A vector is a row of equal segments, each holding partial sums of one input. Merging
        two vectors adds the first half of every segment of both to its second half, so the
        result has twice the segments at half the width (the first merge crosses the 128-bit
        halves, later ones stay within them). When one vector is left, its segments are folded
        in place until each is one lane. `labels` tracks which input each lane sums."""
        lanes = self.lanes
        merged = [(v, [n] * lanes) for n, v in enumerate(vectors)]
        width = lanes
        while len(merged) > 1:
            half = width // 2
            pairs = zip(merged[::2], merged[1::2])
            merged = []
            for (a, a_labels), (b, b_labels) in pairs:
                low, high, labels = [], [], []
                for start in range(0, lanes, width):
                    low += [start + n for n in range(half)] + \
                           [lanes + start + n for n in range(half)]
                    high += [start + half + n for n in range(half)] + \
                            [lanes + start + half + n for n in range(half)]
                    labels += [a_labels[start]] * half + [b_labels[start]] * half
                merged.append((self.add_shuffles(a, b, low, high), labels))
            width = half
        (vector, labels), = merged
        while width > 1:
            half = width // 2
            count = len(labels)
            low = [start + n for start in range(0, count, width) for n in range(half)]
            high = [start + half + n for start in range(0, count, width) for n in range(half)]
            vector = self.add_shuffles(vector, vector, low, high)
            labels = [labels[n] for n in low]
            width = half
        lane_of = {label: lane for lane, label in enumerate(labels)}
        return [self.builder.extract_element(vector, ir.IntType(32)(lane_of[n]))
                for n in range(len(vectors))]

    def add_shuffles(self, a, b, low, high):
        builder = self.builder
        return builder.fadd(builder.shuffle_vector(a, b, _mask(low)),
                            builder.shuffle_vector(a, b, _mask(high)), flags=_FAST)


class _Strided:
    """Byte addresses into a 2-d array of any layout."""

    def __init__(self, builder, intp, array):
        self.builder, self.intp = builder, intp
        self.data = builder.ptrtoint(array.data, intp)
        self.row_stride, self.column_stride = cgutils.unpack_tuple(builder, array.strides)

    def row(self, index):
        return self.builder.add(self.data, self.builder.mul(index, self.row_stride))

    def at(self, row, column):
        return self.builder.add(row, self.builder.mul(column, self.column_stride))


def _mask(lanes):
    return ir.Constant(ir.VectorType(ir.IntType(32), len(lanes)), lanes)


def _node_pass(nodes, rows):
    """y[s + i, r] (`added`: added to) for i < nodes and every r in [row_begin, row_end),
    `rows` rows at a time."""
    block, one_row = dot_block(nodes, rows), dot_block(nodes, 1)

    @numba.njit(fastmath=True, nogil=True, inline="always")
    def node_pass(weight, x, y, s, row_begin, row_end, added):
        columns = x.shape[1]
        r = row_begin
        while r + rows <= row_end:
            block(weight, x, y, s, r, columns, added)
            r += rows
        while r < row_end:
            one_row(weight, x, y, s, r, columns, added)
            r += 1

    return node_pass


_six_nodes = _node_pass(6, 2)
_five_nodes = _node_pass(5, 2)
_four_nodes = _node_pass(4, 2)
_three_nodes = _node_pass(3, 2)
_two_nodes = _node_pass(2, 4)
_one_node = _node_pass(1, 4)


def _node_walk(six, five, four, three, two, one):
    """rows nodes through passes of 6, then the last 1-5 in one pass. A pass is
    `(a, x, y, s, begin, end, added)` for its nodes from s on."""

    @numba.njit(fastmath=True, nogil=True, inline="always")
    def walk(a, x, y, rows, begin, end, added):
        s = 0
        while s + 6 <= rows:
            six(a, x, y, s, begin, end, added)
            s += 6
        left = rows - s
        if left == 5:
            five(a, x, y, s, begin, end, added)
        elif left == 4:
            four(a, x, y, s, begin, end, added)
        elif left == 3:
            three(a, x, y, s, begin, end, added)
        elif left == 2:
            two(a, x, y, s, begin, end, added)
        elif left == 1:
            one(a, x, y, s, begin, end, added)

    return walk


_dot_walk = _node_walk(_six_nodes, _five_nodes, _four_nodes, _three_nodes, _two_nodes,
                       _one_node)


@numba.njit(fastmath=True, cache=True, nogil=True)
def matmul_rows(weight, x, y, rows, row_begin, row_end):
    """y[s, r] = Σ_k weight[r, k] · x[s, k] for s < rows and row_begin <= r < row_end."""
    _dot_walk(weight, x, y, rows, row_begin, row_end, False)


# Outer-product blocks -------------------------------------------------------------------
OUTER_CHUNK = 64


def outer_block(nodes, vectors, splits=1):
    """An intrinsic `block(panels, x, y, s, panel, r, added)`: for i < nodes and
    c < vectors · lanes, y[s + i, r + c] = Σ_k x[s + i, k] · panels[panel + c // width, k,
    c % width] (`added`: y plus that sum), where a panel's `width` is two vectors. Per column
    k: `vectors` loads of panel rows, `nodes` broadcasts, nodes × vectors multiply-adds into
    vector accumulators. y's columns must be adjacent (`matmul_share` checks).

    The accumulators sum `OUTER_CHUNK` columns at a time, the first chunk's sums stored in y
    (or added, `added`) and each later one's added to it (y is zeroed only where there are no
    columns and nothing is added to): one running sum over all 512 columns of a float32
    product erred three times as much as the dot blocks' lanes of partial sums (eight, with
    AVX2), enough to exceed the benchmark's tolerance; in chunks of 64 the error is about the
    dot blocks', for little more time (the chunk's additions to y).

    `splits`: that many sets of accumulators, each taking every `splits`-th column of a chunk.
    A multiply-add waits 4 cycles for the one before it into the same accumulator, and two
    issue a cycle, so a block needs 8 accumulators to keep both units busy: a one-node block
    has 2 and ran at a quarter of the rate (see `_panel_pass`)."""

    @intrinsic
    def block(typingctx, panels, x, y, s, panel, r, added):
        if not (isinstance(panels, types.Array) and panels.ndim == 3
                and all(isinstance(a, types.Array) and a.ndim == 2 for a in (x, y))
                and panels.dtype == x.dtype == y.dtype
                and y.dtype in (types.float32, types.float64)):
            raise TypingError(f"outer_block needs 3-d panels and 2-d x and y of one float "
                              f"dtype, not {(panels, x, y)}")

        def codegen(context, builder, signature, args):
            panels_array, x_array, y_array = (
                context.make_array(t)(context, builder, v)
                for t, v in zip(signature.args[:3], args[:3]))
            _OuterBlock(context, builder, signature.args[2].dtype, nodes, vectors,
                        splits).emit(panels_array, x_array, y_array, *args[3:])
            return context.get_dummy_value()

        return types.void(panels, x, y, s, panel, r, types.boolean), codegen

    block.__name__ = f"outer_block_{nodes}x{vectors}_{splits}"
    return block


class _OuterBlock(_Block):
    def __init__(self, context, builder, dtype, nodes, vectors, splits):
        super().__init__(context, builder, dtype, nodes, vectors)
        self.vectors, self.splits = vectors, splits

    def emit(self, panels_array, x_array, y_array, s, panel, r, added):
        builder, intp = self.builder, self.intp
        x, y = _Strided(builder, intp, x_array), _Strided(builder, intp, y_array)
        panel_stride, column_stride, _ = cgutils.unpack_tuple(builder, panels_array.strides)
        columns = cgutils.unpack_tuple(builder, panels_array.shape)[1]
        panel_data = builder.ptrtoint(panels_array.data, intp)
        panel_rows = [builder.add(panel_data, builder.mul(builder.add(panel, intp(q)),
                                                          panel_stride))
                      for q in range(self.vectors // 2)]
        x_rows = [x.row(builder.add(s, intp(i))) for i in range(self.nodes)]
        zero = ir.Constant(self.vector, [ir.Constant(self.element, 0.0)] * self.lanes)
        accumulators = [[[cgutils.alloca_once_value(builder, zero) for _ in range(self.vectors)]
                         for _ in range(self.nodes)] for _ in range(self.splits)]
        every_accumulator = [accumulator for split in accumulators for node in split
                             for accumulator in node]
        outputs = [[builder.inttoptr(y.at(y.row(builder.add(s, intp(i))),
                                          builder.add(r, intp(j * self.lanes))),
                                     self.vector.as_pointer()) for j in range(self.vectors)]
                   for i in range(self.nodes)]
        nothing = builder.and_(builder.icmp_signed("==", columns, intp(0)), builder.not_(added))
        with builder.if_then(nothing):
            for row_outputs in outputs:
                for output in row_outputs:
                    builder.store(zero, output, align=self.element_bytes)

        def multiply_column(k, split):
            offset = builder.mul(k, column_stride)
            panel_vectors = [self.load(builder.add(builder.add(row, offset),
                                                   intp(half * VECTOR_BYTES)), self.vector)
                             for row in panel_rows for half in range(2)]
            for i, x_row in enumerate(x_rows):
                broadcast = self.broadcast(self.load(x.at(x_row, k), self.element))
                for accumulator, panel_vector in zip(accumulators[split][i], panel_vectors):
                    self.multiply_add(accumulator, broadcast, panel_vector)

        with cgutils.for_range_slice(builder, intp(0), columns, intp(OUTER_CHUNK), intp) \
                as (chunk, _):
            chunk_end = builder.add(chunk, intp(OUTER_CHUNK))
            chunk_end = builder.select(builder.icmp_signed("<", columns, chunk_end), columns,
                                       chunk_end)
            split_end = builder.sub(chunk_end, builder.srem(builder.sub(chunk_end, chunk),
                                                            intp(self.splits)))
            for accumulator in every_accumulator:
                builder.store(zero, accumulator)
            with cgutils.for_range_slice(builder, chunk, split_end, intp(self.splits), intp) \
                    as (k, _):
                for split in range(self.splits):
                    multiply_column(builder.add(k, intp(split)), split)
            with cgutils.for_range_slice(builder, split_end, chunk_end, intp(1), intp) as (k, _):
                multiply_column(k, 0)
            later = builder.icmp_signed("!=", chunk, intp(0))
            self.store([self.split_sum([builder.load(accumulators[split][i][j])
                                        for split in range(self.splits)])
                        for i in range(self.nodes) for j in range(self.vectors)],
                       [output for row_outputs in outputs for output in row_outputs],
                       builder.or_(later, added))

    def split_sum(self, values):
        """The splits' partial sums, added in pairs."""
        while len(values) > 1:
            pairs = [self.builder.fadd(a, b, flags=_FAST)
                     for a, b in zip(values[::2], values[1::2])]
            values = pairs + values[2 * len(pairs):]
        return values[0]

    def broadcast(self, value):
        builder, lanes = self.builder, self.lanes
        vector = builder.insert_element(ir.Constant(self.vector, ir.Undefined), value,
                                        ir.IntType(32)(0))
        return builder.shuffle_vector(vector, vector, _mask([0] * lanes))


@intrinsic
def pack_block(typingctx, weight, panels, panel, k):
    """panels[panel, k + c, j] = weight[panel · width + j, k + c] for c < lanes and j < width
    (two vectors): two lanes × lanes blocks transposed in registers, log2(lanes) rounds of
    shuffles, each swapping one bit of the row index with the same bit of the column index.
    The weight's columns must be adjacent (`weight_panels` checks)."""
    if not (isinstance(weight, types.Array) and weight.ndim == 2
            and isinstance(panels, types.Array) and panels.ndim == 3
            and weight.dtype == panels.dtype and weight.dtype in (types.float32, types.float64)):
        raise TypingError(f"pack_block needs a 2-d weight and 3-d panels of one float dtype, "
                          f"not {(weight, panels)}")

    def codegen(context, builder, signature, args):
        block = _Block(context, builder, signature.args[0].dtype, 1, 1)
        intp, lanes = block.intp, block.lanes
        weight_array, panels_array = (context.make_array(t)(context, builder, v)
                                      for t, v in zip(signature.args[:2], args[:2]))
        panel, k = args[2:]
        weight = _Strided(builder, intp, weight_array)
        panel_stride, column_stride, _ = cgutils.unpack_tuple(builder, panels_array.strides)
        out = builder.add(builder.add(builder.ptrtoint(panels_array.data, intp),
                                      builder.mul(panel, panel_stride)),
                          builder.mul(k, column_stride))
        first_row = builder.mul(panel, intp(2 * lanes))
        for half in range(2):
            rows = [block.load(weight.at(weight.row(builder.add(first_row,
                                                                intp(half * lanes + i))), k),
                               block.vector) for i in range(lanes)]
            for c, column in enumerate(_transposed(builder, rows, lanes)):
                address = builder.add(builder.add(out, builder.mul(intp(c), column_stride)),
                                      intp(half * VECTOR_BYTES))
                builder.store(column, builder.inttoptr(address, block.vector.as_pointer()),
                              align=block.element_bytes)
        return context.get_dummy_value()

    return types.void(weight, panels, panel, k), codegen


def _transposed(builder, rows, lanes):
    """The columns of a lanes × lanes block held as row vectors."""
    bit = 1
    while bit < lanes:
        rows = list(rows)
        for a in range(lanes):
            if a & bit:
                continue
            b = a | bit
            low = [j if not j & bit else lanes + (j ^ bit) for j in range(lanes)]
            high = [j | bit if not j & bit else lanes + j for j in range(lanes)]
            rows[a], rows[b] = (builder.shuffle_vector(rows[a], rows[b], _mask(low)),
                                builder.shuffle_vector(rows[a], rows[b], _mask(high)))
        bit <<= 1
    return rows


@numba.njit(inline="always")
def panel_width(itemsize):
    """A panel's columns (or rows): two vectors' worth of elements of `itemsize` bytes."""
    return 2 * VECTOR_BYTES // itemsize


@numba.njit(nogil=True, cache=True)
def weight_panels(weight, pack):
    """Room for the weight's panels (`pack_share` fills them): one per two vectors' worth of
    whole rows, none when `pack` is false or the weight's columns are not adjacent."""
    width = panel_width(weight.itemsize)
    adjacent = weight.strides[1] == weight.itemsize
    count = weight.shape[0] // width if pack and adjacent else 0
    return np.empty((count, weight.shape[1], width), dtype=weight.dtype)


@numba.njit(nogil=True, cache=True)
def row_panels(weight):
    """The panels of a weight whose rows are adjacent (a parameter read transposed, `pT_W`):
    the parameter's own rows, cut in two vectors' worth of columns, are panels as they lie, a
    view with nothing to pack (their panels' rows lie a parameter row apart, not adjacent,
    which costs little)."""
    width = panel_width(weight.itemsize)
    if weight.strides[0] != weight.itemsize:
        width = weight.shape[0] + 1  # no panels: the products read the rows as they are
    return as_strided(weight, shape=(weight.shape[0] // width, weight.shape[1], width),
                      strides=(width * weight.itemsize, weight.strides[1], weight.itemsize))


# A stride in bytes between a panel's rows that puts them in few cache sets: 16 lines of 64
# bytes, or a multiple of that, falls in at most 4 of an L1's 64 sets.
ALIASED_STRIDE = 1024


@numba.njit(nogil=True, cache=True)
def transposed_room(weight, pack):
    """Room to pack the panels of a parameter read transposed (`pT_W`, rows adjacent) into,
    where `pack` and the parameter's rows are a multiple of `ALIASED_STRIDE` apart; none
    elsewhere (`transposed_panels` then reads the rows as they lie). Walked as they lie, such
    panels read every row from the same few cache sets: H=512's transposed products ran at
    135 GFLOP/s so, at 240 from packed panels. Room of its own, since a user's parameter may
    be read-only."""
    panels = row_panels(weight)
    count = panels.shape[0]
    if not (pack and count > 0 and panels.strides[1] % ALIASED_STRIDE == 0):
        count = 0
    return np.empty((count, panels.shape[1], panels.shape[2]), dtype=weight.dtype)


@numba.njit(nogil=True, cache=True)
def pack_rows_share(weight, room, worker, workers):
    """Worker `worker`'s 1/`workers` of the parameter rows of `transposed_room`'s room:
    room[p, k, lane] = weight[p · width + lane, k]; nothing where there is no room."""
    width = room.shape[2]
    rows = weight.shape[1]
    if room.shape[0] == 0:
        return
    for k in range(worker * rows // workers, (worker + 1) * rows // workers):
        for p in range(room.shape[0]):
            for lane in range(width):
                room[p, k, lane] = weight[p * width + lane, k]


@numba.njit(nogil=True, cache=True)
def sum_rows_share(rows, total, worker, workers):
    """Worker `worker`'s 1/`workers` of total[c] = Σ_n rows[n, c] (a bias's gradient from its
    rows, in a backward kernel): whole cache lines of the columns, each summed over the rows
    in their order, so that the sums are the same on any count."""
    width = 64 // total.itemsize
    lines = -(-total.size // width)
    first = min(total.size, worker * lines // workers * width)
    end = min(total.size, (worker + 1) * lines // workers * width)
    share = total[first:end]
    share[:] = 0
    for n in range(rows.shape[0]):
        row = rows[n, first:end]
        for column in range(share.size):
            share[column] += row[column]


@numba.njit(nogil=True, cache=True)
def transposed_panels(weight, room):
    """The panels the products read of a parameter read transposed: those packed into
    `room`, where there is room, else its rows as they lie (`row_panels`)."""
    if room.shape[0] > 0:
        return room
    return row_panels(weight)


@numba.njit(nogil=True, cache=True)
def tail_rows(weight, panels):
    """The rows of a parameter read transposed (`pT_W`, columns not adjacent) after its
    whole panels, copied so that their columns are adjacent: the dot blocks read such a row
    as it lies an element at a time, many times slower than as vectors. No rows for a weight
    whose columns are adjacent, which they read as it lies."""
    first = weight.shape[0]
    if weight.strides[1] != weight.itemsize:
        first = panels.shape[0] * panels.shape[2]
    return np.ascontiguousarray(weight[first:])


@numba.njit(fastmath=True, nogil=True, cache=True)
def pack_share(weight, panels, row_block, worker, workers):
    """Worker `worker`'s panels: those in its 1/`workers` of the weight's rows, where most of
    the rows it multiplies through lie (`matmul_share` moves the split within a pair of
    workers, so it also reads some panels its partner packed)."""
    if panels.shape[0] == 0:
        return
    width = panels.shape[2]
    lanes = width // 2
    first, end = _share(weight.shape[0], row_block, worker, workers)
    panel_begin = -(-first * row_block // width)
    panel_end = min(panels.shape[0], end * row_block // width)
    columns = weight.shape[1]
    vector_end = columns - columns % lanes
    for panel in range(panel_begin, panel_end):
        for k in range(0, vector_end, lanes):
            pack_block(weight, panels, panel, k)
        for k in range(vector_end, columns):
            for j in range(width):
                panels[panel, k, j] = weight[panel * width + j, k]


PANEL_SPLITS = {1: 4, 2: 2, 3: 2}


def _panel_pass(nodes):
    """y[s + i, r] (`added`: added to) for i < nodes and every row of panels
    [panel_begin, panel_end), a panel at a time. Passes of 1–3 nodes split their columns over
    2–4 sets of accumulators (`PANEL_SPLITS`), to have 8–12 in flight, which made them faster
    than one set; one node is bound by the panels' bandwidth however it is split."""
    block = outer_block(nodes, 2, PANEL_SPLITS.get(nodes, 1))

    @numba.njit(fastmath=True, nogil=True, inline="always")
    def panel_pass(panels, x, y, s, panel_begin, panel_end, added):
        width = panels.shape[2]
        for panel in range(panel_begin, panel_end):
            block(panels, x, y, s, panel, panel * width, added)

    return panel_pass


_panel_walk = _node_walk(*(_panel_pass(nodes) for nodes in (6, 5, 4, 3, 2, 1)))

# The columns of x (rows of the panels) that one walk over the nodes takes where the panels'
# rows lie apart (panels that are a parameter's or the nodes' rows as they lie, a weight
# gradient's): the panels' rows of a block of 64 weight rows for 64 columns, 16 KiB in
# float32, stay in L1 while every node passes through them, where a walk over all the columns
# read them from L2, a row of 128 bytes at a time, for each pass of six nodes. Packed panels,
# whose rows are adjacent, stream from L2 well, and walked by depth the products over many
# nodes ran slower (benchmarks/README.md, "Measurements behind the code"). One
# `OUTER_CHUNK`, so that every sum is added in the order it was before.
PANEL_DEPTH = OUTER_CHUNK


@numba.njit(fastmath=True, nogil=True, inline="always")
def _panel_walk_by_depth(panels, x, y, rows, panel_begin, panel_end):
    """`_panel_walk` over x's columns `PANEL_DEPTH` at a time where the panels' rows lie
    apart (all at once where they are adjacent), each depth's sums added to the ones before
    (a walk with no columns at all zeroes y)."""
    columns = max(x.shape[1], 1)
    depth = columns
    if panels.strides[1] != panels.shape[2] * panels.itemsize:
        depth = PANEL_DEPTH
    for k in range(0, columns, depth):
        _panel_walk(panels[:, k:k + depth], x[:, k:k + depth], y, rows, panel_begin,
                    panel_end, k > 0)


@numba.njit(fastmath=True, nogil=True, cache=True)
def panel_rows(panels, x, y, rows, panel_begin, panel_end):
    """y[s, r] = Σ_k panels[r // width, k, r % width] · x[s, k] for s < rows and the rows r of
    panels [panel_begin, panel_end), with `matmul_rows`' choice of node passes (6 nodes a
    panel at a time is 12 accumulators), `PANEL_DEPTH` columns at a time."""
    _panel_walk_by_depth(panels, x, y, rows, panel_begin, panel_end)


@numba.njit(nogil=True, cache=True)
def _share(num_rows, row_block, worker, workers):
    """The blocks of `row_block` rows that worker `worker` of `workers` owns: [first, end)."""
    blocks = (num_rows + row_block - 1) // row_block
    return worker * blocks // workers, (worker + 1) * blocks // workers


@intrinsic
def fetch_add(typingctx, counters, index, value):
    """counters[index] += value atomically; the value before."""
    if not (isinstance(counters, types.Array) and counters.ndim == 1
            and counters.dtype == types.int64):
        raise TypingError(f"fetch_add needs a 1-d int64 array, not {counters}")

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        pointer = cgutils.get_item_pointer(context, builder, signature.args[0], array,
                                           [args[1]])
        return builder.atomic_rmw("add", pointer, context.cast(builder, args[2],
                                                                signature.args[2], types.int64),
                                  "monotonic")

    return types.int64(counters, index, value), codegen


@numba.njit(fastmath=True, cache=True, nogil=True)
def matmul_share(weight, panels, tail, x, y, rows, row_block, worker, workers, forward,
                 claimed, starts):
    """Worker `worker` of `workers`' part of the product over all of the weight's rows, in
    blocks of `row_block` rows. Workers 2j and 2j + 1 share segment j of the blocks. Each takes
    its first 7/16 of them unasked, then claims the rest one at a time from a counter they
    share (`claimed[j]`: zero before a product, reset by the pair's last claim), so that when
    a neighbour on this shared host slows one core the other takes up to 9/16 of the blocks;
    with fixed halves both waited for the slower, which in such spells took a quarter to a
    third longer than the other over a forest (claiming more of the blocks cost time when
    the host is quiet).

    The two walk a circle of the segment's blocks in opposite directions from `starts[j]`.
    Alternate batches (`forward`) reverse both walks and start them where the two met, so
    each worker starts on the rows it read last, still in its L2. Within a block the rows of
    whole panels go through `panel_rows`' walk (when the run packed any, and y's columns are
    adjacent), the others `matmul_rows`', those from `tail`'s first on (`tail_rows`: the
    weight's last rows, their columns adjacent) read from it. The walks are inlined, not
    called: a call to another cached runtime function could land in the copy of it that
    numba links into this one and optimizes again, and that copy of `panel_rows` ran about
    half as slow again, depending on which function a process happened to load first."""
    num_rows = weight.shape[0]
    tail_begin = num_rows - tail.shape[0]
    width = panels.shape[2]
    use_panels = panels.shape[0] > 0 and y.strides[1] == y.itemsize
    segment, segments = worker // 2, (workers + 1) // 2
    first, end = _share(num_rows, row_block, segment, segments)
    blocks = end - first
    if blocks == 0:
        return
    even = worker % 2 == 0
    alone = worker + 1 >= workers and even
    down = even == forward
    start = starts[segment]
    own = blocks if alone else blocks * 7 // 16  # blocks the partner cannot claim
    contested = blocks - 2 * own
    taken = 0
    while not (alone and taken == blocks):
        if not alone and taken >= own:
            claim = fetch_add(claimed, segment, 1)
            if claim >= contested:
                if claim == contested + 1:  # the pair's last claim: both have read the start
                    claimed[segment] = 0
                    even_taken = taken if even else blocks - taken
                    starts[segment] = (start - even_taken if forward
                                       else start + even_taken) % blocks
                break
        offset = (start - 1 - taken) % blocks if down else (start + taken) % blocks
        taken += 1
        row_begin = (first + offset) * row_block
        row_end = min(num_rows, row_begin + row_block)
        weight_end = min(row_end, tail_begin)
        panel_begin = -(-row_begin // width)
        panel_end = min(panels.shape[0], row_end // width)
        if not use_panels or panel_begin >= panel_end:
            _dot_walk(weight, x, y, rows, row_begin, weight_end, False)
        else:
            _dot_walk(weight, x, y, rows, row_begin, panel_begin * width, False)
            _panel_walk_by_depth(panels, x, y, rows, panel_begin, panel_end)
            _dot_walk(weight, x, y, rows, panel_end * width, weight_end, False)
        if weight_end < row_end:
            _dot_walk(tail, x, y[:, tail_begin:], rows, weight_end - tail_begin,
                      row_end - tail_begin, False)
