"""The parameters in GPU memory as a vjp's forward read them, kept on the device, so that a
pullback can refuse parameters changed in place since (an optimizer's step before a second
pullback), as `autodiff.pullback.ForwardValues` does for the host's: the backward would
otherwise mix the new parameters with the forward's states, a gradient at no point."""
import numpy as np
from numba import cuda

from . import device, runtime
from .buffers import PackedArrays

FLAGS = "changed"  # the packed array of one flag a parameter


class DeviceValues:
    """`DeviceValues({name: (array, rows)})`: a copy on the device of each GPU array's rows
    `rows` (a host index array: the rows of a table its forest gathers), or of all its rows
    (None). The copies and a flag a parameter are views of one allocation, the rows' indices
    go up in one copy, and `changed(params)` compares them in a launch a parameter and
    copies the flags back once: the flags it marked with this check's number changed."""

    def __init__(self, arrays):
        tables = {name: _as_rows(values) for name, (values, _) in arrays.items()}
        orders = [np.arange(tables[name].shape[0]) if rows is None else rows
                  for name, (_, rows) in arrays.items()]
        self.gathered = {name: rows is not None for name, (_, rows) in arrays.items()}
        dtype = next(iter(tables.values())).dtype
        shapes = {name: (order.size, table.shape[1])
                  for (name, table), order in zip(tables.items(), orders)}
        self.kept = PackedArrays({**shapes, FLAGS: (len(tables),)}, dtype, returned=(FLAGS,))
        ends = np.cumsum([order.size for order in orders])
        uploaded = device.to_device("the rows a pullback compares",
                                    np.concatenate(orders).astype(np.int64), np.int64)
        self.rows = {name: uploaded[end - order.size:end]
                     for name, order, end in zip(tables, orders, ends)}
        for name, table in tables.items():
            kept = self.kept.arrays[name]
            if kept.size:
                runtime.gather_rows[device.grid_stride(kept.size)](
                    table, self.rows[name], kept, kept.shape[0])
        self.kept.arrays[FLAGS].copy_to_device(np.zeros(len(tables), dtype))
        self.marks = 0

    def changed(self, params):
        """[(name, whether only its gathered rows were compared)] of the parameters whose
        values differ from the forward's."""
        self.marks += 1
        flags = self.kept.arrays[FLAGS]
        for slot, (name, rows) in enumerate(self.rows.items()):
            kept = self.kept.arrays[name]
            if kept.size:
                table = _as_rows(getattr(params, name))
                runtime.rows_differ[device.grid_stride(kept.size)](
                    _bits(table), rows, _bits(kept), flags, slot, self.marks)
        marks = self.kept.to_host()[FLAGS]
        return [(name, self.gathered[name]) for name, mark in zip(self.rows, marks)
                if mark == self.marks]


def _as_rows(values):
    """A GPU parameter (a numba device array, or an object exposing
    `__cuda_array_interface__`, which the forward found C-contiguous) as a numba device
    array of rows: (rows, the rest flattened)."""
    if not device.is_cuda_ndarray(values):
        values = cuda.as_cuda_array(values)
    rows = values.shape[0] if values.ndim else 1
    return values.reshape(rows, values.size // rows if rows else 0)


def _bits(values):
    """A float device array seen as unsigned integers of its item's size."""
    return values.view(np.dtype(f"u{values.dtype.itemsize}"))
