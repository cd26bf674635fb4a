"""Frontend: the cell function's source → P.1–P.3 proven → the cell IR (docs/design.md §1, §2)."""
from .build import build_cell_ir
from .cell_ir import CellCase, CellIR, Op
from .names import Binding
from .properties import check_properties
from .source import read_source, require_code

__all__ = ["Binding", "CellCase", "CellIR", "Op", "build_cell_ir", "check_properties",
           "read_source", "require_code"]
