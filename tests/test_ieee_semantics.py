"""NaN and infinities: an exact kernel (every float64 one, and float32 ones with
`fast_math=False`) computes what NumPy computes with them, on the CPU and in the CUDA simulator:
maximum and minimum take a NaN from either side, constants may be infinite or NaN, and the
arithmetic is IEEE's (an infinity minus itself is NaN)."""
import math

import numpy as np
import pytest

import recjit as rj

from conftest import assert_same_result

INF, NEG_INF, NAN = math.inf, -math.inf, float("nan")


@rj.recursive_model(arity=2)
def non_finite(node, p):
    if node.is_leaf:
        x = p.E[node.word]
        return x, x, x, x, x, x, x
    h = non_finite(node.left, p)[0] + non_finite(node.right, p)[0]
    log_h = rj.log(h)  # NaN where h < 0, -inf where h == 0
    e = rj.exp(400.0 * h)  # inf where h > 1.8
    return (rj.maximum(p.b, log_h), rj.minimum(log_h, p.b), rj.relu(log_h), e - e + p.b,
            rj.minimum(h, INF), rj.maximum(NEG_INF, log_h), h + NAN)


FOREST = rj.Forest.from_nested([(0, 1), ((0, 1), (1, 2)), 2])


def params(dtype):
    return rj.Params(E=np.array([[-1.0, 0.0, 1.5], [0.5, 0.0, 1.0], [2.0, -3.0, 0.0]], dtype),
                     b=np.zeros(3, dtype))


@pytest.mark.parametrize("dtype, schedule", [
    ("float64", rj.Schedule()), ("float32", rj.Schedule(fast_math=False))],
    ids=["float64", "float32 exact"])
def test_an_exact_cpu_kernel_computes_nan_and_infinities_as_numpy(dtype, schedule):
    p = params(dtype)
    with np.errstate(all="ignore"):
        assert_same_result(non_finite.run(FOREST, p, schedule=schedule),
                           non_finite.reference(FOREST, p))


@pytest.mark.parametrize("schedule", [rj.Schedule(), rj.Schedule(fusion=False)],
                         ids=["fused", "unfused"])
def test_a_float64_cuda_kernel_computes_nan_and_infinities_as_numpy(schedule):
    p = params("float64")
    with np.errstate(all="ignore"):
        assert_same_result(non_finite.run(FOREST, p, backend="cuda", schedule=schedule),
                           non_finite.reference(FOREST, p))


def test_an_exact_kernel_lets_llvm_fuse_multiply_adds_and_assume_nothing_else():
    source = non_finite.kernel_source("cpu", FOREST, params("float64"))
    assert '@njit(parallel=True, fastmath={"contract"}' in source
    assert "real(np.inf)" in source and "real(-np.inf)" in source and "real(np.nan)" in source
