"""Device memory kept from run to run. On a GPU, numba-cuda spends tens of microseconds on
each device allocation and on each view of a device array, more than a small forest's whole
kernel takes (tools/gpu_profile.py). So a run's arrays are sized up to a bucket, the next power
of two of their rows, and kept: a forest whose sizes fall in buckets seen before allocates
nothing, makes no views, and reaches the device in one copy per dtype.

The kernels never read an array's row count (sizes come in as scalars), so rows past a forest's
own are never touched; only the columns of a state or scratch array are its real ones."""
from collections import OrderedDict

import numpy as np

from . import device

# Layouts (of forests, states, scratch) kept per kernel; the least recently used goes first.
KEPT_LAYOUTS = 8
SMALLEST_BUCKET = 16


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


class _Upload:
    """One layout of forest arrays: per dtype, a staging buffer on the host (pinned), its
    copy on the device, and the device views of each array in it."""

    def __init__(self, layout):
        self.slots = {}  # name: (dtype, offset, size in the staging buffer)
        totals = {}
        for name, dtype, shape in layout:
            size = int(np.prod(shape))
            self.slots[name] = (dtype, totals.get(dtype, 0), size)
            totals[dtype] = totals.get(dtype, 0) + size
        self.staging = {dtype: device.pinned_array(total, np.dtype(dtype))
                        for dtype, total in totals.items()}
        self.on_device = {dtype: device.device_array(total, np.dtype(dtype))
                          for dtype, total in totals.items()}
        self.views = {name: self.on_device[dtype][offset:offset + size].reshape(shape)
                      for (name, dtype, shape), (_, offset, size)
                      in zip(layout, self.slots.values())}

    def copy(self, arrays):
        for name, values in arrays.items():
            dtype, offset, _ = self.slots[name]
            self.staging[dtype][offset:offset + values.size] = values.ravel()
        for dtype, staging in self.staging.items():
            self.on_device[dtype].copy_to_device(staging)
        return self.views


class DeviceBuffers:
    """A kernel's device memory: the forest's arrays, the states, the scratch."""

    def __init__(self):
        self._uploads = _Kept()
        self._states = _Kept()
        self._scratch = _Kept()

    def forest(self, arrays):
        """Device views of the forest's arrays {name: array}, filled from them."""
        layout = tuple((name, values.dtype.str, _bucketed(values.shape))
                       for name, values in arrays.items())
        return self._uploads.get_or_make(layout, lambda: _Upload(layout)).copy(arrays)

    def states(self, num_nodes, columns, dtype):
        """{name: a (bucketed num_nodes, columns) device array} for {name: columns}."""
        rows = bucket(num_nodes)
        return self._states.get_or_make((rows, tuple(columns.items()), dtype), lambda: {
            name: device.device_array((rows, size), dtype) for name, size in columns.items()})

    def scratch(self, shapes, leading, dtype):
        """{name: device array} for {name: shape}: the first `leading[name]` dimensions as
        they are (one per block), the next one bucketed, the rest as they are."""
        bucketed = tuple((name, shape[:leading[name]] + _bucketed(shape[leading[name]:]))
                         for name, shape in shapes.items())
        return self._scratch.get_or_make((bucketed, dtype), lambda: {
            name: device.device_array(shape, dtype) for name, shape in bucketed})


def _bucketed(shape):
    return (bucket(shape[0]),) + tuple(shape[1:]) if shape else shape
