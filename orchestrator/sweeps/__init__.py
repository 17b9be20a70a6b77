"""Sweeps: Ray Tune searches and schedules; each trial is one job, on a warm group or a worker group of its own."""
