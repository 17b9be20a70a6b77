"""The error types the CLI turns into a one-line message: ConfigError (exit code 2) and RunFailed (1).

Everything a user can get wrong (a YAML field, a flag, a path) raises ConfigError with a message that names
the thing and says how to fix it. Anything else is a bug and keeps its traceback.
"""


class ConfigError(ValueError):
    """Bad user input: a config field, a CLI flag, a missing file."""


class RunFailed(RuntimeError):
    """Training itself failed (a worker error, a hang, a non-finite loss): one line says which and where."""
