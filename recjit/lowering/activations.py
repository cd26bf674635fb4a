"""The float32 fast-math tanh and sigmoid, one formulation for both code generators: Eigen's
branch-free rational tanh, within 5e-7 of the exact one (docs/fast_math.md). On the GPU it
also replaces what numba-cuda's `fastmath` makes of `math.tanh`, the hardware's
`tanh.approx.f32`, whose relative error is about 2^-11."""

CLAMP = "7.90531110763549805"  # where float32 tanh rounds to ±1
NUMERATOR = ("-2.76076847742355e-16", "2.00018790482477e-13", "-8.60467152213735e-11",
             "5.12229709037114e-08", "1.48572235717979e-05", "6.37261928875436e-04",
             "4.89352455891786e-03")
DENOMINATOR = ("1.19825839466702e-06", "1.18534705686654e-04", "2.26843463243900e-03",
               "4.89352518554385e-03")


def horner(name, coefficients):
    """Lines evaluating the polynomial in x2 with these coefficients, highest power first."""
    return ([f"    {name} = real({coefficients[0]})"]
            + [f"    {name} = {name} * x2 + real({c})" for c in coefficients[1:]])


def fast_tanh_and_sigmoid(decorator):
    """The source of `tanh(x)` and `sigmoid(x)`, each under `decorator` (`@njit(...)`,
    `@cuda.jit(device=True, ...)`), in a module that defines `real`."""
    return "\n".join([
        "",
        "# tanh as Eigen's rational approximation (13/6): branch-free, so it vectorizes; max abs and",
        "# rel error 4e-7 in float32 (docs/fast_math.md). Clamped where tanh rounds to ±1.",
        decorator,
        "def tanh(x):",
        f"    x = min(max(x, real(-{CLAMP})), real({CLAMP}))",
        "    x2 = x * x",
        *horner("p", NUMERATOR),
        *horner("q", DENOMINATOR),
        "    return x * p / q",
        "",
        "",
        decorator,
        "def sigmoid(x):",
        "    return real(0.5) + real(0.5) * tanh(real(0.5) * x)",
        ""])
