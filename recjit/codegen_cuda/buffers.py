"""Device memory kept from run to run. On a GPU, numba-cuda spends tens of microseconds on
each device allocation and on each view of a device array, more than a small forest's whole
kernel takes (tools/gpu_profile.py). So a run's arrays are sized up to a bucket, the next power
of two of their rows, and kept: a forest whose sizes fall in buckets seen before allocates
nothing, makes no views, and reaches the device in one packed copy.

The kernels never read an array's row count (sizes come in as scalars), so rows past a forest's
own are never touched; only the columns of a state or scratch array are its real ones."""
import weakref
from collections import OrderedDict

import numpy as np

from . import device
from .roots import root_name

# Layouts (of forests, states, scratch) kept per kernel; the least recently used goes first.
KEPT_LAYOUTS = 8
SMALLEST_BUCKET = 16
# Bytes every array of a packed upload is aligned to (the widest vector load).
ALIGNMENT = 16


def bucket(rows):
    """The rows allocated for `rows`: the next power of two, at least SMALLEST_BUCKET."""
    return max(SMALLEST_BUCKET, 1 << (int(rows) - 1).bit_length())


class _Kept(OrderedDict):
    """At most KEPT_LAYOUTS entries, the least recently used dropped first."""

    def get_or_make(self, key, make):
        if key in self:
            self.move_to_end(key)
        else:
            self[key] = make()
            if len(self) > KEPT_LAYOUTS:
                self.popitem(last=False)
        return self[key]


def _packed(layout):
    """Each array's bytes [begin, end) in one buffer holding the arrays of `layout`
    ((name, dtype, shape), ...), every one starting on an ALIGNMENT boundary; and its size."""
    spans, total = [], 0
    for _, dtype, shape in layout:
        end = total + int(np.prod(shape)) * np.dtype(dtype).itemsize
        spans.append((total, end))
        total = -(-end // ALIGNMENT) * ALIGNMENT
    return spans, max(total, ALIGNMENT)


class _Upload:
    """One layout of forest arrays packed into one byte buffer: pinned on the host, its copy on
    the device, and each array's view of both."""

    def __init__(self, layout):
        spans, total = _packed(layout)
        self.staging = device.pinned_array(total, np.uint8)
        self.on_device = device.device_array(total, np.uint8)
        self.copies = device.Copies(self.staging, self.on_device)
        self.staged, self.views = {}, {}
        self.queued = False  # whether the device may not have copied the staging buffer yet
        self.names = tuple(name for name, _, _ in layout)
        self.capacity = tuple(shape[0] for _, _, shape in layout)
        for (name, dtype, shape), (begin, end) in zip(layout, spans):
            self.staged[name] = self.staging[begin:end].view(dtype)
            self.views[name] = device.packed_view(self.on_device, begin, end, dtype, shape)

    def holds(self, arrays):
        """Whether `arrays` are the ones laid out here, each with no more rows than its view:
        a kernel's forest arrays of one name have the same dtype and other dimensions in every
        run (a run with GPU fields uploads `old_of_new` instead)."""
        if tuple(arrays) != self.names:
            return False
        for values, rows in zip(arrays.values(), self.capacity):
            if len(values) > rows:
                return False
        return True

    def copy(self, arrays):
        """Queue the copy of `arrays` to the device; their views there. The staging buffer
        is rewritten only once the device has copied it: a run that copies states back has
        waited for it, one that returned device arrays may not have."""
        if self.queued:
            device.synchronize()
        for name, values in arrays.items():
            self.staged[name][:values.size] = values.ravel()
        self.copies.queue_to_device()
        self.queued = True
        return self.views


class _States:
    """One layout of states packed into one device buffer, each state's rows after the one
    before's, then the roots' rows of each state (which the kernel gathers there), and pinned
    host memory as large. A run copies back the roots' rows alone, in one copy; a `Result`
    borrows the buffer until it has read its nodes, which come back only if asked for (see
    `roots`)."""

    def __init__(self, rows, root_rows, columns, dtype):
        layout = (tuple((name, dtype, (rows, size)) for name, size in columns)
                  + tuple((root_name(name), dtype, (root_rows, size)) for name, size in columns))
        spans, total = _packed(layout)
        self.on_device = device.device_array(total, np.uint8)
        self.staging = device.pinned_array(total, np.uint8)
        self.copies = device.Copies(self.staging, self.on_device)
        self.row_bytes = [size * np.dtype(dtype).itemsize for _, size in columns]
        views = {name: device.packed_view(self.on_device, begin, end, dtype, shape)
                 for (name, _, shape), (begin, end) in zip(layout, spans)}
        self.arrays = {name: views[name] for name, _ in columns}
        self.root_arrays = {root_name(name): views[root_name(name)] for name, _ in columns}
        self.views = {**self.arrays, **self.root_arrays}  # the kernel's arguments
        # The same arrays in the pinned host memory, where they come back.
        on_host = [self.staging[begin:end].view(dtype).reshape(shape)
                   for (_, _, shape), (begin, end) in zip(layout, spans)]
        self.nodes_on_host, self.roots_on_host = on_host[:len(columns)], on_host[len(columns):]
        self.roots_begin = spans[len(columns)][0]
        self.last_root_begin, self.last_node_begin = spans[-1][0], spans[len(columns) - 1][0]
        self.borrower = None  # a weak reference to the Result whose nodes are still here

    def roots_to_host(self, roots):
        """Each state's rows of the first `roots` roots, in host arrays of their own."""
        self.copies.to_host(self.roots_begin, self.last_root_begin - self.roots_begin
                            + roots * self.row_bytes[-1])
        return [state[:roots].copy() for state in self.roots_on_host]

    def nodes_to_host(self, rows):
        """Each state's first `rows` rows, in host arrays of their own."""
        self.copies.to_host(0, self.last_node_begin + rows * self.row_bytes[-1])
        return [state[:rows].copy() for state in self.nodes_on_host]

    def lend(self, result):
        """`result` reads its nodes from here until it has them."""
        self.borrower = weakref.ref(result)

    def borrowing(self):
        """The live result that still reads its nodes from here, or None."""
        result = self.borrower() if self.borrower is not None else None
        return result if result is not None and not result.has_nodes else None

    def lent(self):
        return self.borrowing() is not None

    def reclaim(self):
        """Make the borrowing result copy its nodes now: the next run overwrites them."""
        result = self.borrowing()
        if result is not None:
            result.nodes  # noqa: B018 (reading them copies them)
        self.borrower = None


class PackedArrays:
    """Device arrays of exact shapes ({name: shape}, all of `dtype`), views of one new
    allocation, the `returned` ones first, so that they come back to the host in one copy.
    For arrays sized by one forest's exact counts, which a later forest's would not fit as
    they are (a backward's gradient rows, whose sums read their columns' count), and which a
    pullback may keep while later runs go on (a forward's kept products): an allocation and
    a copy in all, where an array each costs one each, and a free each."""

    def __init__(self, shapes, dtype, returned=()):
        names = list(returned) + [name for name in shapes if name not in returned]
        layout = tuple((name, dtype, shapes[name]) for name in names)
        spans, total = _packed(layout)
        self.dtype = np.dtype(dtype)
        self.buffer = device.device_array(total, np.uint8)
        self.spans = {name: (begin, end, shape)
                      for (name, _, shape), (begin, end) in zip(layout, spans)}
        self.arrays = {name: device.packed_view(self.buffer, begin, end, dtype, shape)
                       for name, (begin, end, shape) in self.spans.items()}
        self.returned = tuple(returned)

    def to_host(self):
        """The `returned` arrays, copied back in one synchronous copy, after the launches
        queued before it."""
        if not self.returned:
            return {}
        returned_bytes = self.spans[self.returned[-1]][1]
        on_host = (self.buffer[:returned_bytes].copy_to_host() if returned_bytes
                   else np.empty(0, np.uint8))
        return {name: on_host[begin:end].view(self.dtype).reshape(shape)
                for name, (begin, end, shape) in self.spans.items() if name in self.returned}


class _Field:
    """A GPU field's rows in the linearized order: `array`, (bucketed rows,) + the field's
    other dimensions, which the kernel reads; `rows`, the same memory as (rows, columns),
    which the gather writes."""

    def __init__(self, rows, shape, dtype):
        self.array = device.device_array((bucket(rows),) + tuple(shape), dtype)
        self.rows = self.array.reshape(bucket(rows), int(np.prod(shape)))


class DeviceBuffers:
    """A kernel's device memory: the forest's arrays, the states, the scratch, GPU fields in
    the linearized order."""

    def __init__(self):
        self._uploads = _Kept()
        self._states = _Kept()
        self._scratch = _Kept()
        self._fields = _Kept()

    def forest(self, arrays):
        """Device views of the forest's arrays {name: array}, filled from them: in a kept
        upload that holds them, else in a new one of their bucketed sizes."""
        for upload in self._uploads.values():
            if upload.holds(arrays):
                return upload.copy(arrays)
        layout = tuple((name, values.dtype.str, _bucketed(values.shape))
                       for name, values in arrays.items())
        return self._uploads.get_or_make(layout, lambda: _Upload(layout)).copy(arrays)

    def copied(self):
        """The device has run every upload queued so far (the caller has waited for it)."""
        for upload in self._uploads.values():
            upload.queued = False

    def states(self, num_nodes, num_roots, columns, dtype):
        """The states {name: a (bucketed num_nodes, size) device array} for the ((name, size),
        ...) of `columns`, the roots' rows of each, and their way back to the host. Of two
        buffers per layout, one that no result still reads its nodes from: a caller keeping
        the latest result only never waits for a copy of its nodes."""
        rows, root_rows = bucket(num_nodes), bucket(num_roots)
        key = (rows, root_rows, columns, dtype)
        pair = self._states.get_or_make(key, list)
        free = next((states for states in pair if not states.lent()), None)
        if free is None and len(pair) < 2:
            free = _States(rows, root_rows, columns, dtype)
        elif free is None:
            free = pair[0]
            free.reclaim()
        if free in pair:
            pair.remove(free)
        pair.append(free)  # the least recently used first
        return free

    def field(self, name, rows, shape, dtype):
        """The `_Field` that holds GPU field `name`, of `shape` a node, for `rows` nodes."""
        key = (name, bucket(rows), tuple(shape), np.dtype(dtype).str)
        return self._fields.get_or_make(key, lambda: _Field(rows, shape, dtype))

    def scratch(self, shapes, dtype):
        """A device array for each of `shapes` (bucketed already: `emit_scratch_shapes`)."""
        return self._scratch.get_or_make((shapes, dtype), lambda: [
            device.device_array(shape, dtype) for shape in shapes])


def _bucketed(shape):
    return (bucket(shape[0]),) + tuple(shape[1:]) if shape else shape
