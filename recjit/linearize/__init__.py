"""Forests and their linearization into the arrays kernels walk (DESIGN §3)."""
from .forest import Forest, random_bracketing
from .linearizer import Linearized, distinct, first_outside, linearize

__all__ = ["Forest", "Linearized", "distinct", "first_outside", "linearize", "random_bracketing"]
