"""Looking after clusters, beside launches and sweeps: `doctor`, and `cluster up/down/check` (real Ray nodes on
this machine, a spec checked against a live cluster)."""
