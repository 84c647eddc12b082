"""Compiled (numba) kernels of shared/pq/kmeans.py: the fused assignment.

The Lloyd loop over it, and the centroid sums, are shared/pq/_lloyd.py (its threaded
variant shared/pq/_threads.py); subsampling and k-means++ seeding are
shared/pq/_seeding.py (all reuse the helpers and compile settings here).

Why compiled: at the paper's shapes k-means is memory passes and per-call overhead, not
arithmetic (docs/PERFORMANCE.md). Here one pass over a block of points computes the scores
of every centroid and keeps the running minimum and its index: no (N, L) score matrix, no
separate argmin pass, no per-call overhead per group (all R groups run in one call).

Determinism: every kernel is sequential (no parallel loops; no fastmath reassociation but for
the k-means++ potential, shared/pq/_seeding.py), so its output depends on its input only,
never on the thread count. Floats are summed in a fixed order; the centroid sums are
float64, updated incrementally, in point order, by the points that changed label.

Compile cost: ``cache=True`` keeps the compiled code on disk (numba's __pycache__ beside this
file, or NUMBA_CACHE_DIR; when neither is writable, a per-user directory under the temporary
directory is used), so only the first process after an install or upgrade compiles
(measured in benchmarks/quantizer.py as ``first_call``).

Layout: points come twice, row-major (n, s) for the sums and transposed (s, n) for the
scores, so that the inner loop runs over contiguous points and vectorizes (SIMD) over them.
"""

import os
import tempfile
from pathlib import Path
from typing import Any


def _ensure_writable_cache() -> None:
    """Point numba's cache at a writable directory when the package directory is read-only."""
    if "NUMBA_CACHE_DIR" in os.environ or os.access(Path(__file__).parent, os.W_OK):
        return
    fallback = Path(tempfile.gettempdir()) / f"fedlite-numba-{os.getuid()}"
    fallback.mkdir(mode=0o700, exist_ok=True)
    os.environ["NUMBA_CACHE_DIR"] = str(fallback)


_ensure_writable_cache()

import numba  # noqa: E402  (after the cache directory is settled: numba reads it on import)
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba.core import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

__all__ = ["assign_groups", "assign_points", "block_buffers", "transpose_groups"]

# Points per block of the assignment: the block's transposed points (s x block floats, at
# most BLOCK_FLOATS = 128 KiB), its running minima and labels stay in the L2 cache (512 KiB
# per core here; its four score rows in L1) while every centroid passes over them. Measured:
# 512 points beat 256 by 10-15 % at s = 32 and 64, and 1024 gains nothing.
BLOCK = 512
BLOCK_FLOATS = 32768

# float32, so that the products stay float32 (a Python -2.0 would promote them to float64)
_MINUS_TWO = np.float32(-2.0)

jit = numba.njit(cache=True, nogil=True, boundscheck=False, fastmath={"contract"})


def _realign_frame(typingctx: Any) -> Any:
    """Realign the calling kernel's stack frame to 64 bytes (``_aligned_frame()``).

    The score loops keep more 8-float registers than AVX2 has and spill them to the stack in
    32-byte slots; LLVM places the slots at multiples of 32 from the stack pointer without
    realigning it, and x86-64 promises 16 only. With address-space randomisation the stack's
    offset differs per process, so in some processes the spills split cache lines: one
    L = 32 pass took 0.266-0.285 ms there against 0.223-0.231 in the others (L = 16:
    0.144-0.151 against 0.122-0.125; eight processes, docs/PERFORMANCE.md). An alloca
    aligned to 64 bytes makes LLVM realign the frame in its prologue; the empty inline
    assembly that takes its address keeps it from being optimised away.
    """

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        with builder.goto_entry_block():
            slot = builder.alloca(ir.IntType(8), size=64)
        slot.align = 64
        builder.asm(ir.FunctionType(ir.VoidType(), [slot.type]), "", "r", [slot], True)
        return context.get_dummy_value()

    return types.none(), codegen


_aligned_frame: Any = intrinsic(_realign_frame)


@jit
def transpose_groups(points: np.ndarray) -> np.ndarray:
    """(G, n, s) -> (G, s, n) float32, 64 points at a time: each block's rows stay in L1
    while its columns are written out (2-4x faster than numpy's strided copy here)."""
    g, n, s = points.shape
    out = np.empty((g, s, n), dtype=np.float32)
    for group in range(g):
        for start in range(0, n, 64):
            stop = min(start + 64, n)
            for k in range(s):
                column, row = points[group, start:stop, k], out[group, k, start:stop]
                for i in range(stop - start):
                    row[i] = column[i]
    return out


@jit
def rows8(pt: np.ndarray, k: int, start: int, m: int) -> tuple[np.ndarray, ...]:
    """Dimensions k..k+7 of points start..start+m of pt (s, n), as 8 contiguous rows.

    Inner loops index these from 0: an index like ``start + i`` makes numba check for
    negative indices, which hides the unit stride from the vectorizer (it gathers instead,
    ~6x slower).
    """
    stop = start + m
    return (
        pt[k, start:stop], pt[k + 1, start:stop], pt[k + 2, start:stop], pt[k + 3, start:stop],
        pt[k + 4, start:stop], pt[k + 5, start:stop], pt[k + 6, start:stop], pt[k + 7, start:stop],
    )  # fmt: skip


@jit
def coef8(w: np.ndarray, k: int) -> tuple[float, ...]:
    """w[k:k+8] as scalars: hoisted out of the inner loops, which store to float32 arrays
    that the compiler cannot prove distinct from w."""
    return (w[k], w[k + 1], w[k + 2], w[k + 3], w[k + 4], w[k + 5], w[k + 6], w[k + 7])


@jit
def _dot8(a: tuple[float, ...], q: tuple[np.ndarray, ...], i: int) -> Any:
    """sum_j a[j] * q[j][i] over 8 dimensions, in float32, in a fixed order."""
    return ((a[0] * q[0][i] + a[1] * q[1][i]) + (a[2] * q[2][i] + a[3] * q[3][i])) + (
        (a[4] * q[4][i] + a[5] * q[5][i]) + (a[6] * q[6][i] + a[7] * q[7][i])
    )


@jit
def _nearer(score: float, c: int, old: float, old_c: int) -> tuple[Any, Any]:
    """(score, c) if score < old else (old, old_c): ties keep the lower index."""
    closer = score < old
    return (score if closer else old), (np.int32(c) if closer else old_c)


@jit
def _nearest4(
    sa: float, sb: float, sc: float, sd: float, c: int, old: float, old_c: int
) -> tuple[Any, Any]:
    """The running minimum after the scores of centroids c..c+3, in index order."""
    near, index = _nearer(sa, c, old, old_c)
    near, index = _nearer(sb, c + 1, near, index)
    near, index = _nearer(sc, c + 2, near, index)
    return _nearer(sd, c + 3, near, index)


@jit
def _scores4(
    pt: np.ndarray,
    start: int,
    m: int,
    scaled: np.ndarray,
    c_sq: np.ndarray,
    c: int,
    acc: np.ndarray,
) -> None:
    """acc[j, :m] = score of centroid c+j (j < 4) for points start..start+m of pt (s, n),
    s a multiple of 8: ||c||^2 plus the 8-dimension partial dot products, in dimension order.

    Four centroids per pass over the points: each point row loaded once feeds 32 products,
    a quarter of the loads of one centroid at a time (4-7x faster at s = 32 and 64 here).
    """
    _aligned_frame()
    s = pt.shape[0]
    a0, a1, a2, a3 = acc[0], acc[1], acc[2], acc[3]
    for i in range(m):
        a0[i], a1[i], a2[i], a3[i] = c_sq[c], c_sq[c + 1], c_sq[c + 2], c_sq[c + 3]
    for k in range(0, s, 8):
        q = rows8(pt, k, start, m)
        w0, w1 = coef8(scaled[c], k), coef8(scaled[c + 1], k)
        w2, w3 = coef8(scaled[c + 2], k), coef8(scaled[c + 3], k)
        for i in range(m):
            # every load of q before any store to acc: no reload for a possible alias
            d0, d1 = _dot8(w0, q, i), _dot8(w1, q, i)
            d2, d3 = _dot8(w2, q, i), _dot8(w3, q, i)
            a0[i] += d0
            a1[i] += d1
            a2[i] += d2
            a3[i] += d3


@jit
def _leading_s8(
    pt: np.ndarray,
    start: int,
    m: int,
    scaled: np.ndarray,
    c_sq: np.ndarray,
    best: np.ndarray,
    spare: np.ndarray,
    label: np.ndarray,
) -> tuple[int, np.ndarray, np.ndarray]:
    """The running minimum over centroids 0..c at s = 8, four (then two) per pass with no
    score row through memory; returns c and the (best, spare) buffers as swapped."""
    _aligned_frame()
    num = scaled.shape[0]
    c = 0
    q = rows8(pt, 0, start, m)
    while c + 4 <= num:
        best, spare = spare, best
        w0, w1 = coef8(scaled[c], 0), coef8(scaled[c + 1], 0)
        w2, w3 = coef8(scaled[c + 2], 0), coef8(scaled[c + 3], 0)
        b0, b1, b2, b3 = c_sq[c], c_sq[c + 1], c_sq[c + 2], c_sq[c + 3]
        for i in range(m):
            best[i], label[i] = _nearest4(
                b0 + _dot8(w0, q, i), b1 + _dot8(w1, q, i), b2 + _dot8(w2, q, i),
                b3 + _dot8(w3, q, i), c, spare[i], label[i],
            )  # fmt: skip
        c += 4
    if c + 2 <= num:  # L = 2: two centroids in one pass
        best, spare = spare, best
        w0, w1 = coef8(scaled[c], 0), coef8(scaled[c + 1], 0)
        b0, b1 = c_sq[c], c_sq[c + 1]
        for i in range(m):
            near, index = _nearer(b0 + _dot8(w0, q, i), c, spare[i], label[i])
            best[i], label[i] = _nearer(b1 + _dot8(w1, q, i), c + 1, near, index)
        c += 2
    return c, best, spare


@jit
def _leading_by4(
    pt: np.ndarray,
    start: int,
    m: int,
    scaled: np.ndarray,
    c_sq: np.ndarray,
    acc: np.ndarray,
    best: np.ndarray,
    spare: np.ndarray,
    label: np.ndarray,
) -> tuple[int, np.ndarray, np.ndarray]:
    """The running minimum over centroids 0..c (c = L rounded down to a multiple of 4) at
    s a multiple of 8, four centroids' scores per pass; returns c and the swapped buffers."""
    c = 0
    while c + 4 <= scaled.shape[0]:
        best, spare = spare, best
        _scores4(pt, start, m, scaled, c_sq, c, acc)
        a0, a1, a2, a3 = acc[0], acc[1], acc[2], acc[3]
        for i in range(m):
            best[i], label[i] = _nearest4(a0[i], a1[i], a2[i], a3[i], c, spare[i], label[i])
        c += 4
    return c, best, spare


@jit
def assign_block(
    pt: np.ndarray,
    start: int,
    m: int,
    scaled: np.ndarray,
    c_sq: np.ndarray,
    acc: np.ndarray,
    best: np.ndarray,
    spare: np.ndarray,
    label: np.ndarray,
) -> None:
    """label[:m] = nearest centroid of points start..start+m of pt (s, n); ties go to the
    lowest index. scaled (L, s) = -2 * centroids, c_sq (L,) = ||c||^2, acc (4, >= m) scratch.

    The score ||c||^2 - 2 c.p is summed 8 dimensions at a time when s is a multiple of 8,
    four centroids per pass (at s = 8 with nothing through memory but the running minimum),
    else one dimension at a time; either way the score of a centroid is ||c||^2 plus its
    8-dimension partial sums in dimension order, so every path gives the same bits. Every
    inner loop runs along contiguous points and vectorizes. The old minimum is read from one
    buffer and the new one written to the other, with no conditional load or store:
    otherwise the compiler emits masked moves, microcoded (slow) on AMD cores.
    """
    _aligned_frame()
    s = pt.shape[0]
    num = scaled.shape[0]
    for i in range(m):
        best[i] = np.inf
        label[i] = 0
    c = 0
    if s == 8:
        c, best, spare = _leading_s8(pt, start, m, scaled, c_sq, best, spare, label)
    elif s % 8 == 0:
        c, best, spare = _leading_by4(pt, start, m, scaled, c_sq, acc, best, spare, label)
    first = acc[0]
    while c < num:  # the last L mod 4 centroids, or every centroid when s is not a multiple of 8
        best, spare = spare, best
        for i in range(m):
            first[i] = c_sq[c]
        if s % 8 == 0:
            for k in range(0, s, 8):
                q, w = rows8(pt, k, start, m), coef8(scaled[c], k)
                for i in range(m):
                    first[i] += _dot8(w, q, i)
        else:
            for k in range(s):
                row, wk = pt[k, start : start + m], scaled[c, k]
                for i in range(m):
                    first[i] += wk * row[i]
        for i in range(m):
            best[i], label[i] = _nearer(first[i], c, spare[i], label[i])
        c += 1


@jit
def prepare(centroids: np.ndarray, scaled: np.ndarray, c_sq: np.ndarray) -> None:
    """scaled (L, s) = -2 * centroids and c_sq (L,) = ||c||^2 (float32, dimension order)."""
    for c in range(centroids.shape[0]):
        total = np.float32(0.0)
        for k in range(centroids.shape[1]):
            total += centroids[c, k] * centroids[c, k]
            scaled[c, k] = _MINUS_TWO * centroids[c, k]
        c_sq[c] = total


@jit
def block_buffers(s: int) -> tuple[np.ndarray, ...]:
    """Scratch of :func:`assign_points` for points of s dimensions: (scratch (s, block), acc
    (4, block), best, spare (block,) float32, label (block,) int32)."""
    block = max(8, min(BLOCK, BLOCK_FLOATS // s // 8 * 8))
    return (
        np.empty((s, block), dtype=np.float32),
        np.empty((4, block), dtype=np.float32),
        np.empty(block, dtype=np.float32),
        np.empty(block, dtype=np.float32),
        np.empty(block, dtype=np.int32),
    )


@jit
def assign_points(
    points: np.ndarray,
    scaled: np.ndarray,
    c_sq: np.ndarray,
    start: int,
    stop: int,
    labels: np.ndarray,
    buffers: tuple[np.ndarray, ...],
) -> None:
    """labels[start:stop] = nearest centroid of points start..stop of one group.

    points (n, s) float32 row-major; scaled (L, s) and c_sq (L,) from :func:`prepare`; labels
    (n,) int64; buffers from :func:`block_buffers`. Each block of points is transposed into
    a scratch buffer that stays in cache, rather than the whole array first (one pass over
    all points: the copy would cost as much as the assignment at L = 2). A point's label
    depends on that point and the centroids only, so any split into ranges gives the same.
    """
    scratch, acc, best, spare, label = buffers
    s = points.shape[1]
    block = scratch.shape[1]
    for first in range(start, stop, block):
        m = min(block, stop - first)
        for k in range(s):
            column, row = points[first : first + m, k], scratch[k]
            for i in range(m):
                row[i] = column[i]
        assign_block(scratch, 0, m, scaled, c_sq, acc, best, spare, label)
        for i in range(m):
            labels[first + i] = label[i]


@jit
def assign_groups(points: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Nearest centroid of every point: points (G, n, s), centroids (G, L, s) float32 ->
    (G, n) int64 (:func:`assign_points` on every group)."""
    g, n, s = points.shape
    num = centroids.shape[1]
    labels = np.empty((g, n), dtype=np.int64)
    scaled = np.empty((num, s), dtype=np.float32)
    c_sq = np.empty(num, dtype=np.float32)
    buffers = block_buffers(s)
    for group in range(g):
        prepare(centroids[group], scaled, c_sq)
        assign_points(points[group], scaled, c_sq, 0, n, labels[group], buffers)
    return labels
