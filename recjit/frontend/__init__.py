"""Frontend: the cell function's source → P.1–P.3 proven → the cell IR (DESIGN §1, §2)."""
from .build import build_cell_ir
from .cell_ir import CellCase, CellIR, Op
from .names import changeable_in_place, frozen_values
from .properties import check_properties
from .source import read_source

__all__ = ["CellCase", "CellIR", "Op", "build_cell_ir", "changeable_in_place",
           "check_properties", "frozen_values", "read_source"]
