"""Slow float64 reference of the ps update rules, shared by the MPI checks and unit tests."""

import numpy as np


def reference_updates(kind: str, theta0: np.ndarray, grads: list[tuple[int, np.ndarray]],
                      lr: float, decay: float, eps: float, mom: float, n_clients: int) -> np.ndarray:
    """Slow float64 reference written from the papers' formulas, one gradient at a time."""
    theta = theta0.astype(np.float64)
    acc = {c: np.zeros_like(theta) for c in range(n_clients)}   # per-client state
    shared = np.zeros_like(theta)                                # shared state
    first, t = np.zeros_like(theta), 0                           # Adam's m and step count
    for client, g in grads:
        g = g.astype(np.float64)
        if kind == "sgd":
            theta = theta - lr * g
        elif kind == "momentum":        # Mnih 2016 S7: m = a m + (1 - a) g, per thread
            acc[client] = mom * acc[client] + (1 - mom) * g
            theta = theta - lr * acc[client]
        elif kind == "adagrad":         # Duchi et al.: G += g^2, theta -= lr g / sqrt(G + eps)
            shared = shared + g * g
            theta = theta - lr * g / np.sqrt(shared + eps)
        elif kind == "rmsprop_shared":  # Mnih 2016 S7: g = a g + (1 - a) dtheta^2, shared
            shared = decay * shared + (1 - decay) * g * g
            theta = theta - lr * g / np.sqrt(shared + eps)
        elif kind == "rmsprop_per_client":
            acc[client] = decay * acc[client] + (1 - decay) * g * g
            theta = theta - lr * g / np.sqrt(acc[client] + eps)
        elif kind == "adam_shared":     # Kingma & Ba: bias-corrected moments; eps inside the root
            t += 1
            first = mom * first + (1 - mom) * g
            shared = decay * shared + (1 - decay) * g * g
            m_hat, v_hat = first / (1 - mom ** t), shared / (1 - decay ** t)
            theta = theta - lr * m_hat / np.sqrt(v_hat + eps)
    return theta
