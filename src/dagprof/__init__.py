"""dagprof: why distributed training is slower than linear, and what to change."""
__version__ = "0.1.0"
