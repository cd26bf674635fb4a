"""The fast tanh and sigmoid of generated kernels stay within their documented error bounds
(docs/fast_math.md) over the float32 range, through the real generated code path, on the CPU
and on the GPU (in numba's simulator, without one)."""
import numpy as np
import recjit as rj

TANH_MAX_ERROR = 5e-7      # absolute, and relative to |tanh(x)|
SIGMOID_MAX_ERROR = 3e-7   # absolute


@rj.recursive_model(arity=2)
def activations(node, p):
    if node.is_leaf:
        x = p.E[node.word]
        return rj.tanh(x), rj.sigmoid(x)
    return activations(node.left, p)


def float32_inputs():
    """Every magnitude from 1e-38 to 3e38 (log-spaced), both signs, and a dense grid near 0."""
    magnitudes = np.logspace(-38, 38.5, 300_000, dtype=np.float64).astype(np.float32)
    grid = np.linspace(-20, 20, 400_001, dtype=np.float32)
    return np.concatenate([magnitudes, -magnitudes, grid, np.float32([0.0])])


def activations_of(x, backend="cpu"):
    forest = rj.Forest(np.zeros(x.size + 1, np.int64), [], np.arange(x.size),
                       fields={"word": np.arange(x.size)})
    return activations.run(forest, rj.Params(E=x.reshape(-1, 1)), backend=backend).nodes


def assert_within_the_documented_errors(x, tanh, sigmoid):
    exact = np.tanh(x.astype(np.float64))
    tanh_error = np.abs(tanh[:, 0] - exact)
    assert tanh_error.max() <= TANH_MAX_ERROR
    assert (tanh_error / np.maximum(np.abs(exact), 1e-30)).max() <= TANH_MAX_ERROR
    exact_sigmoid = 0.5 * (1 + np.tanh(0.5 * x.astype(np.float64)))
    assert np.abs(sigmoid[:, 0] - exact_sigmoid).max() <= SIGMOID_MAX_ERROR


def test_fast_tanh_and_sigmoid_stay_within_their_documented_errors():
    x = float32_inputs()
    assert_within_the_documented_errors(x, *activations_of(x))


def test_fast_tanh_and_sigmoid_on_the_gpu_stay_within_the_same_errors():
    """numba-cuda's `fastmath` would make `math.tanh` the hardware's tanh.approx.f32 (2^-11
    relative); the kernel defines the CPU's rational tanh instead. Normal float32 inputs only:
    a GPU's fast math flushes subnormals to zero. The simulator runs each thread in Python:
    every 97th of the inputs."""
    x = float32_inputs()
    x = x[np.abs(x) >= np.finfo(np.float32).tiny][::97]
    assert_within_the_documented_errors(x, *activations_of(x, backend="cuda"))
    source = activations.kernel_source("cuda")
    assert "def tanh(x):" in source
    assert "math.tanh(" not in source


def test_float64_kernels_use_the_exact_functions():
    x = np.linspace(-20, 20, 10_001)
    tanh, sigmoid = activations_of(x)
    np.testing.assert_allclose(tanh[:, 0], np.tanh(x), rtol=1e-15, atol=1e-16)
    np.testing.assert_allclose(sigmoid[:, 0], 1 / (1 + np.exp(-x)), rtol=1e-15, atol=1e-16)
