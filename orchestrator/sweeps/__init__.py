"""Sweeps: Ray Tune over full multi-worker Ray Train runs of the shared loop."""
