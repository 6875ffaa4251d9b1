"""The tools beside the benchmark that are not benchmarks: the load generator (``python -m
tools.load``) and the real-GPU acceptance check (``tools/gpu_check.py``, ``make gpu-check``)."""
