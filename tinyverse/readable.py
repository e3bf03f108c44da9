"""Numbers as people read them: a return with the digits its scale needs, a mean with its spread
and its count (eval, run's verdict and progress, info)."""

import math

import numpy as np


def number(x: float) -> str:
    """``x`` with at least 3 significant digits and all of its whole part (0.958, 98.4, 243, 1234):
    one decimal showed 0.958 as 1.0, and 0.86 as a target of 0.9 reached."""
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    if abs(x) < 1e-3:  # an exponent reads better than a row of zeros
        return f"{x:.3g}"
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


def spread(values) -> str:
    """``mean ± standard deviation`` of ``values`` (``27.3 ± 3.10``; ``0.958 ± 0`` when all are
    equal, where NumPy's sum leaves a rounding error such as 1.11e-16)."""
    std = 0.0 if np.ptp(values) == 0 else np.std(values)
    return f"{number(np.mean(values))} ± {number(std)}"


def mean(values, what: str = "episodes") -> str:
    """The mean with its spread and count (``0.958 ± 0.0121 over 10 episodes``): what a target is
    judged on, so that a reader sees how far one mean can be trusted."""
    return f"{spread(values)} over {len(values)} {what}"
