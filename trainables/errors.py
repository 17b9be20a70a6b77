"""The one error type the CLI turns into a one-line message and exit code 2.

Everything a user can get wrong (a YAML field, a flag, a path) raises ConfigError with a message that names
the thing and says how to fix it. Anything else is a bug and keeps its traceback.
"""


class ConfigError(ValueError):
    """Bad user input: a config field, a CLI flag, a missing file."""
