"""Random inputs for a program, filled by each input's role.

Roles (declared after the dtype in a spec: `in T[b:B, c:C] f32 onehot`):

- `data` (default): uniform magnitudes in [0.5, 1.5] with random signs, so no value
  is zero or tiny (divisions, logs of squares and normalizations stay well conditioned);
- `positive`: uniform in [0.5, 1.5] (for inputs a spec takes the log or sqrt of);
- `onehot`: exactly one 1 along the last dim at a random position, zeros elsewhere
  (classification targets).

>>> from kernelsat.spec import parse_spec
>>> p = parse_spec('''
... kernel ce(B=3, C=5)
... in X[b:B, c:C] f32
... in T[b:B, c:C] f32 onehot
... out L[b] = sum(c: X[b, c] * T[b, c])
... ''')
>>> env = random_inputs(p, seed=1)
>>> env["T"].sum(axis=1).tolist()
[1.0, 1.0, 1.0]
>>> bool((abs(env["X"]) >= 0.5).all())
True
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kernelsat.gather import INT_DTYPES, label_bounds
from kernelsat.program import Program

Filler = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def _data(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    magnitude = rng.uniform(0.5, 1.5, size=shape)
    return np.where(rng.random(size=shape) < 0.5, -magnitude, magnitude)


def _positive(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(0.5, 1.5, size=shape)


def _onehot(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(shape)
    if not shape:
        out[()] = 1.0
        return out
    hot = rng.integers(0, shape[-1], size=shape[:-1])
    np.put_along_axis(out, hot[..., None], 1.0, axis=-1)
    return out


FILLERS: dict[str, Filler] = {"data": _data, "positive": _positive, "onehot": _onehot}
"""How each input role is filled."""


def random_inputs(
    program: Program, seed: int = 0, dtype: type | np.dtype = np.float64
) -> dict[str, np.ndarray]:
    """One array per input of `program`, in its declared dim order, deterministic in `seed`.
    Values are never zero except the zeros of one-hot inputs. An integer input (gather
    labels, issue 18 part 3b) is int32, uniform over the range of every axis it indexes
    (never all zeros, never out of range) whatever `dtype` asks."""
    rng = np.random.default_rng(seed)
    bounds = label_bounds(program.term)
    out: dict[str, np.ndarray] = {}
    for d in program.inputs:
        if d.dtype in INT_DTYPES:
            out[d.name] = rng.integers(0, bounds.get(d.name, 1), size=tuple(d.dims),
                                       dtype=np.int32)
        else:
            out[d.name] = FILLERS[d.role](rng, tuple(d.dims)).astype(dtype, copy=False)
    return out
