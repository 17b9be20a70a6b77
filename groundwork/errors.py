"""Every error this project raises on purpose, in one small hierarchy.

- ConfigError: bad input (a YAML field, a flag, a path). The CLI prints its one line and exits 2; it is raised
  before anything is written or started.
- RunFailed: the run itself failed (a worker's error, a hang, a non-finite loss). The CLI prints its one line
  and exits 1.
- Preempted: a rank told to stop (SIGTERM) ended after its checkpoint; the run restarts from it, not a failure.
- JobError: the job's own fault (its settings, weights or checkpoints), raised alike on every rank at the same
  point of the job. That is what lets a warm worker group tell "this job failed" from "this group broke": the
  ranks are still in step after a JobError, so the group serves the next job; any other exception in a worker
  fails the group, and Ray Train restarts it.

Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class OrchestratorError(Exception):
    """Base of every error raised on purpose by cluster/, trainables/ and orchestrator/."""


class ConfigError(OrchestratorError, ValueError):
    """Bad user input: a config field, a CLI flag, a missing file."""


class RunFailed(OrchestratorError, RuntimeError):
    """Training itself failed (a worker error, a hang, a non-finite loss): one line says which and where.
    `rows` holds the metric rows the run made before it failed (kept in its metrics.parquet)."""

    def __init__(self, message: str, rows: list[dict[str, float]] | None = None) -> None:
        super().__init__(message)
        self.rows = rows or []


class Interrupted(KeyboardInterrupt):
    """Ctrl-C ended the run (every rank stopped, the newest complete checkpoint kept); `rows` as RunFailed's."""

    def __init__(self, rows: list[dict[str, float]] | None = None, run: str | None = None) -> None:
        super().__init__()
        self.rows, self.run = rows or [], run


class ScriptExited(RunFailed):
    """A rank's torchrun script exited non-zero: which rank, its exit code, its last stderr line, and when (the
    first to exit is the cause; the other ranks' scripts failed because it did)."""

    def __init__(self, rank: int, code: int, last_line: str, at: float) -> None:
        super().__init__(f"rank {rank} exited with code {code}" + (f": {last_line}" if last_line else ""))
        self.rank, self.code, self.last_line, self.at = rank, code, last_line, at

    def __reduce__(self):  # rebuilt from its fields when Ray carries it to the driver
        return (ScriptExited, (self.rank, self.code, self.last_line, self.at))


class Preempted(OrchestratorError, RuntimeError):
    """A rank told to stop (SIGTERM: how Kubernetes, SLURM and a spot VM's shutdown give notice before they
    kill) ended once the checkpoint it asked for was written: the run restarts from it, and the restart is not
    charged to --max-failures."""


class JobError(OrchestratorError, RuntimeError):
    """The job's own fault, raised on every rank at the same point: the worker group is still in step."""


class NonFiniteLoss(JobError):
    """The loss became NaN or inf: stop rather than train (and checkpoint) garbage. Raised on every rank at the
    same log point, after the ranks have exchanged their first bad step."""

    def __init__(self, step: int) -> None:
        super().__init__(f"the loss is not finite (nan/inf) at step {step}: lower --lr, set --grad-clip,"
                         " use --precision bf16 rather than fp16, or pass --skip-nonfinite to skip such steps")
        self.step = step

    def __reduce__(self):  # rebuilt from the step, not the message, when Ray carries it to the driver
        return (NonFiniteLoss, (self.step,))


class CheckpointError(JobError):
    """A checkpoint folder that is missing, incomplete or corrupt. Every rank reads the same folders, so every
    rank raises it alike."""
