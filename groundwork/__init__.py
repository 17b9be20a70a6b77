"""The base every layer may import (cluster/, trainables/, orchestrator/): the project's error types and its
strict YAML reading. It imports nothing of the project."""
