"""Figures for the result files (a run's loss.png and gpu.png, a sweep's sweep.png)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIGURE_MODULE = "matplotlib.figure"  # what figure() imports: ~0.6 s, imported ahead where a process waits anyway


def figure(**options: object) -> Figure:
    """A matplotlib Figure of its own, not pyplot's: no global state or backend to choose (savefig renders
    with Agg), so it may be drawn on any thread."""
    from matplotlib.figure import Figure  # deferred: see FIGURE_MODULE; paid once there are results to plot

    return Figure(**options)
