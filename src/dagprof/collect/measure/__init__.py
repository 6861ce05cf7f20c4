"""Measurements on live ranks that the model reads: all-reduce sweeps, codec costs, compute slowdown beside collectives."""
