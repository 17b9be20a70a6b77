"""`ray start`, keeping 127.0.0.1 as the node address.

Ray's CLI swaps a loopback --node-ip-address for the machine's LAN address (services.resolve_ip_for_localhost),
and its single-host switch (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) refuses a second node. For a multi-node
cluster on one machine that is reachable from nowhere else, `orchestrator cluster up` runs the CLI with that
one swap turned off: every raylet and GCS then listens on 127.0.0.1.
"""

from ray._private import services
from ray.scripts.scripts import main

services.resolve_ip_for_localhost = lambda host: host

if __name__ == "__main__":
    main()
