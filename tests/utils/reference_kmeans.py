"""A deliberately plain numpy k-means, the oracle for the batched torch implementation."""

import numpy as np


def lloyd(points: np.ndarray, init: np.ndarray, iterations: int) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's algorithm from ``init``, float64, explicit loops over clusters.

    points (N, s), init (L, s) -> centroids (L, s), labels (N,). Empty clusters keep their
    centroid; stops early when the labels stop changing (same contract as shared.pq.kmeans).
    """
    x = points.astype(np.float64)
    c = init.astype(np.float64).copy()
    labels = nearest(x, c)
    for _ in range(iterations):
        for k in range(len(c)):
            members = x[labels == k]
            if len(members):
                c[k] = members.mean(axis=0)
        new = nearest(x, c)
        if np.array_equal(new, labels):
            break
        labels = new
    return c, labels


def nearest(points: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Brute-force index of the nearest centroid of each point (ties: lowest index)."""
    d2 = ((points[:, None, :] - centroids[None, :, :]) ** 2).sum(-1)  # (n, l)
    return d2.argmin(axis=1)
