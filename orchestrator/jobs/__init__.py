"""Jobs that outlive the laptop: a launch submitted to a cluster through Ray's Jobs API (`launch --detach`),
and `orchestrator jobs` to list, follow, stop and wait for them."""
