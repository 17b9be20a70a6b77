"""The Ray Train wiring, the lowest layer of orchestrator/: connecting to Ray (session, auth), the typed job a
worker group runs (job), the TorchTrainer factory (trainer) and its torch backend (backend), the function each
rank runs (entry: torch-free) and its body (worker) and what it adds
around a user's `--entry` function (function), and what carries rows, heartbeats and hangs from the ranks to
the driver (sink, watchdog). Nothing here imports Ray on import of the package itself:
orchestrator.raytrain.auth must run before Ray is imported."""
