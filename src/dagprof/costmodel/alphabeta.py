"""The alpha-beta(-gamma) model: a message of M bytes costs alpha + M*beta, reducing it M*gamma.

Ring all-reduce over N workers (Shi et al. 2018, eq. for ring):
    2(N-1) alpha + 2(N-1)/N M beta + (N-1)/N M gamma.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import DagprofError


@dataclass(frozen=True)
class AlphaBeta:
    alpha_us: float  # latency per message (per ring step)
    beta_us_per_byte: float  # inverse bandwidth
    gamma_us_per_byte: float = 0.0  # reduction compute per byte

    def __post_init__(self) -> None:
        if min(self.alpha_us, self.beta_us_per_byte, self.gamma_us_per_byte) < 0:
            raise DagprofError(f"link model must be non-negative, got {self}")

    @classmethod
    def from_bandwidth(cls, bytes_per_s: float, latency_us: float = 0.0, gamma_us_per_byte: float = 0.0) -> "AlphaBeta":
        if bytes_per_s <= 0:
            raise DagprofError(f"bandwidth must be positive, got {bytes_per_s} B/s")
        return cls(latency_us, 1e6 / bytes_per_s, gamma_us_per_byte)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return float("inf") if self.beta_us_per_byte == 0 else 1e6 / self.beta_us_per_byte

    def message_us(self, nbytes: float) -> float:
        return self.alpha_us + nbytes * self.beta_us_per_byte


def ring_allreduce_us(nbytes: float | np.ndarray, workers: int, link: AlphaBeta) -> float | np.ndarray:
    if workers < 1:
        raise DagprofError(f"workers must be >= 1, got {workers}")
    if workers == 1:
        return np.zeros_like(nbytes, dtype=float) if isinstance(nbytes, np.ndarray) else 0.0
    n = workers
    return 2 * (n - 1) * link.alpha_us + 2 * (n - 1) / n * nbytes * link.beta_us_per_byte + (n - 1) / n * nbytes * link.gamma_us_per_byte


def fit_alpha_beta(nbytes: np.ndarray, time_us: np.ndarray, workers: int = 2, relative: bool = True) -> AlphaBeta:
    """Least-squares fit of a ring all-reduce's (alpha, beta) from measured (size, time) pairs, both >= 0.

    Relative residuals are minimised, so 4-byte and 1-GiB messages weigh alike. With
    ``relative=False`` absolute residuals are: the fit then reproduces the measured total
    (residuals sum to zero unless alpha is clipped at 0) and its bandwidth follows the large messages.
    """
    m = np.asarray(nbytes, dtype=float)
    t = np.asarray(time_us, dtype=float)
    if len(m) < 2 or len(m) != len(t):
        raise DagprofError(f"need at least two (size, time) pairs to fit a link model, got {len(m)}")
    n = max(workers, 2)
    a = np.stack([np.full_like(m, 2 * (n - 1)), 2 * (n - 1) / n * m], axis=1)
    w = 1.0 / np.maximum(t, 1e-9) if relative else np.ones_like(t)
    coef, *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    alpha, beta = float(coef[0]), float(coef[1])
    if beta <= 0:  # latency-dominated data: bandwidth from the largest message alone
        beta = max(float(t.max() / (2 * (n - 1) / n * m.max())), 1e-12)
    if alpha < 0:  # no latency: the best fit through the origin, not the clipped line
        x = a[:, 1] * w
        alpha, beta = 0.0, max(float(x @ (t * w) / max(x @ x, 1e-300)), 1e-12)
    return AlphaBeta(alpha, beta)


_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BANDWIDTH = re.compile(r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMgGtT]?)(bits?|b|B)?(/s|ps)?")  # signed: -1Gbit is refused as negative


def parse_bandwidth(text: str) -> float:
    """'10Gbit', '200Mbit/s', '1.5gbps' (bits) or '25GB/s' (bytes, capital B) -> bytes per second."""
    m = _BANDWIDTH.fullmatch(text.strip())
    if not m:
        raise DagprofError(f"cannot read bandwidth {text!r}: use e.g. 10Gbit, 200Mbit, 25GB/s")
    if not m.group(2) and not m.group(3):  # `--bandwidth 10` meant 10 Gbit/s, and was read as 10 bit/s
        raise DagprofError(f"bandwidth {text!r} has no unit: use e.g. 10Gbit, 200Mbit, 25GB/s")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    bytes_per_s = value if m.group(3) == "B" else value / 8
    if not 0 < bytes_per_s < float("inf"):
        raise DagprofError(f"bandwidth must be positive and finite, got {text!r}")
    return bytes_per_s
