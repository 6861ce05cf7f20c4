"""Numbers only: link models, interconnect presets and fits. No graphs, no traces."""
from .alphabeta import AlphaBeta, fit_alpha_beta, parse_bandwidth, ring_allreduce_us
from .presets import PRESETS, preset

__all__ = ["AlphaBeta", "fit_alpha_beta", "parse_bandwidth", "ring_allreduce_us", "PRESETS", "preset"]
