"""The profilers, one per framework: what runs inside the user's training process (hooks, the profiler window, step times)."""
