"""One-node GridSample models with seeded feeds, shared by tests/codegen/test_grid_sample.py (NVRTC
and the host emulator) and test_grid_sample_gpu.py (the engine on a GPU).

The grids mix uniform values beyond [-1, 1] (so that every padding mode matters, reflection by more
than one period included) with the values where the rules decide: coordinates exactly halfway
between pixels (nearest's ties, which round half to even), exactly on pixels, on the bounds lo and
hi of each align_corners form, and -1, 0, 1."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx

from helpers import make_node_model

BF16 = ml_dtypes.bfloat16
MODES = ("nearest", "linear", "cubic")
PADDINGS = ("zeros", "border", "reflection")


def special_values(size: int, align: int) -> np.ndarray:
    """Grid values (float64) whose coordinate on an axis of `size` is a tie, a pixel or a bound."""
    ks = np.arange(-2, size + 2, dtype=np.float64)
    if align:
        d = max(size - 1, 1)
        ties, pixels = (2 * ks + 1) / d - 1, 2 * ks / d - 1
    else:
        ties, pixels = 2 * (ks + 1) / size - 1, (2 * ks + 1) / size - 1
    return np.concatenate([ties, pixels, [-1.0, 0.0, 1.0, -1.5, 1.5, -3.2, 3.7, -2.0, 2.0]])


def make_grid(out: tuple[int, ...], sizes: tuple[int, ...], align: int, dtype=np.float32, seed: int = 0):
    """A grid [N, *out, nd] for X's spatial `sizes`: half uniform in [-1.6, 1.6], half special."""
    rng = np.random.default_rng(seed)
    nd = len(sizes)
    grid = rng.uniform(-1.6, 1.6, (*out, nd))
    for comp in range(nd):
        size = sizes[nd - 1 - comp]  # grid[..., 0] is the last spatial axis
        pool = special_values(size, align)
        pick = rng.random(out) < 0.5
        grid[..., comp] = np.where(pick, rng.choice(pool, out), grid[..., comp])
    return grid.astype(dtype)


def case(
    mode: str,
    padding: str,
    align: int,
    xshape: tuple[int, ...] = (2, 3, 5, 6),
    out: tuple[int, ...] = (4, 7),
    dtype=np.float32,
    grid_dtype=None,
    seed: int = 0,
    opset: int | None = None,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model and feeds: X [N, C, *in] of `dtype`, grid [N, *out, nd] of grid_dtype (X's by default)."""
    rng = np.random.default_rng(seed + 100)
    x = rng.uniform(-2, 2, xshape).astype(dtype)
    grid = make_grid((xshape[0], *out), tuple(xshape[2:]), align, grid_dtype or dtype, seed)
    model = make_node_model(
        "GridSample",
        {"x": x, "grid": grid},
        {"mode": mode, "padding_mode": padding, "align_corners": align},
        opset=opset,
    )
    return model, {"x": x, "grid": grid}


def cases() -> dict[str, dict]:
    """Case name -> keyword arguments of case()."""
    out: dict[str, dict] = {}
    for mode in MODES:
        for padding in PADDINGS:
            for align in (0, 1):
                for dt in ("f32", "f16"):
                    kw = dict(mode=mode, padding=padding, align=align, dtype=np.float32 if dt == "f32" else np.float16)
                    out[f"{mode}-{padding}-a{align}-{dt}"] = kw
    for mode in ("nearest", "linear"):
        for padding in PADDINGS:
            for align in (0, 1):
                out[f"3d-{mode}-{padding}-a{align}"] = dict(
                    mode=mode, padding=padding, align=align, xshape=(2, 2, 3, 4, 5), out=(3, 2, 4)
                )
    out.update(
        {
            "bf16-linear-border": dict(mode="linear", padding="border", align=0, dtype=BF16),
            "bf16-cubic-reflection": dict(mode="cubic", padding="reflection", align=1, dtype=BF16),
            "f32-x-f16-grid-linear": dict(mode="linear", padding="zeros", align=0, grid_dtype=np.float16),
            "f32-x-f16-grid-nearest": dict(mode="nearest", padding="reflection", align=0, grid_dtype=np.float16),
            "f16-x-f32-grid-cubic": dict(
                mode="cubic", padding="zeros", align=0, dtype=np.float16, grid_dtype=np.float32
            ),
            "f64-linear-reflection": dict(mode="linear", padding="reflection", align=0, dtype=np.float64),
            "f32-x-f64-grid-cubic": dict(mode="cubic", padding="border", align=1, grid_dtype=np.float64),
            # axes of size 1 (align_corners=1: no range to reflect in) and 2
            "size1-linear-reflection-a1": dict(mode="linear", padding="reflection", align=1, xshape=(1, 2, 1, 2)),
            "size1-cubic-border-a0": dict(mode="cubic", padding="border", align=0, xshape=(1, 2, 1, 2)),
            "size1-nearest-zeros-a1": dict(mode="nearest", padding="zeros", align=1, xshape=(1, 2, 1, 2)),
            "1d-linear-reflection": dict(mode="linear", padding="reflection", align=0, xshape=(2, 3, 7), out=(9,)),
            "1d-nearest-border": dict(mode="nearest", padding="border", align=1, xshape=(2, 3, 7), out=(9,)),
            # RT-DETR's deformable attention: [N * heads, head_dim, H, W], grid [N * heads, queries, points, 2]
            "rtdetr-linear-zeros": dict(mode="linear", padding="zeros", align=0, xshape=(8, 32, 20, 20), out=(300, 4)),
        }
    )
    return out


CASES = cases()
