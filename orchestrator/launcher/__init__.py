"""Launching one run: the run folder, the choice between a pool and a worker group of its own, and the
run's results (metrics.parquet, loss.png, checkpoints). `launch.launch` is the entry."""
