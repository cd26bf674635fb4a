"""Forests and their linearization into the arrays kernels walk (DESIGN §3)."""
from .forest import Forest, random_bracketing
from .linearizer import Linearized, linearize

__all__ = ["Forest", "Linearized", "linearize", "random_bracketing"]
