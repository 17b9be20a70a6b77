"""`--profile-steps N-M`: torch.profiler over optimizer steps N..M of rank 0, written as a Chrome/Perfetto
trace (open it at ui.perfetto.dev) into <run>/profile/. Other ranks and other steps run unprofiled."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from trainables.config import step_window

log = logging.getLogger(__name__)


class StepProfiler:
    def __init__(self, steps: str | None, out_dir: str | Path | None, is_main: bool) -> None:
        self.window = step_window(steps) if steps and out_dir and is_main else None
        self.out_dir = Path(out_dir) / "profile" if out_dir else None
        self._prof: profile | None = None

    def before_step(self, step: int) -> None:
        """`step` is the number the coming optimizer step will have."""
        if self.window and step == self.window[0]:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self._prof = profile(activities=activities, record_shapes=True, with_stack=False)
            self._prof.__enter__()

    def after_step(self, step: int) -> None:
        if self._prof is not None and self.window and step >= self.window[1]:
            self.stop()

    def stop(self) -> None:
        if self._prof is None or self.out_dir is None or self.window is None:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._prof.__exit__(None, None, None)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"trace-rank0-steps{self.window[0]}-{self.window[1]}.json"
        self._prof.export_chrome_trace(str(path))
        log.info("profile of steps %d-%d written to %s", *self.window, path)
        self._prof = None
