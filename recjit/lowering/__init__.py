"""Lowering: the cell IR → the ILIR kernel with its schedule, and a printer for it."""
from .backward import lower_backward
from .choose import (barriers_per_batch, check_schedule, choose_schedule, internal_barriers,
                     refactor_variants)
from .ilir import Kernel
from .lower import lower
from .printer import print_kernel

__all__ = ["Kernel", "barriers_per_batch", "check_schedule", "choose_schedule",
           "internal_barriers", "lower", "lower_backward", "print_kernel", "refactor_variants"]
