"""Does nothing: the benchmark's no-op worker (measures the launcher, not import torch)."""
