"""Lowering: the cell IR → the ILIR kernel with its schedule, and a printer for it."""
from .ilir import Kernel
from .lower import lower
from .printer import print_kernel

__all__ = ["Kernel", "lower", "print_kernel"]
