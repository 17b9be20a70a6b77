"""`ray start`, keeping 127.0.0.1 as the node address.

Ray's CLI swaps a loopback --node-ip-address for the machine's LAN address (services.resolve_ip_for_localhost).
Its single-host switch (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which `cluster up` sets so that every process it
starts stays on 127.0.0.1) makes the CLI refuse a second node. For a multi-node cluster on one machine that
is reachable from nowhere else, `orchestrator cluster up` runs the CLI with the swap and the refusal off.

Nodes on one machine also share the cluster's session folder, and with it the folder where each node's
runtime-env agent unpacks a job's working_dir and py_modules: a second node's agent, which has not seen the
package, unpacks it again over the first's, under a driver already running inside it. RUNTIME_DIR_ENV names
a folder of the node's own.
"""

import os

from ray._private import ray_constants, services
from ray.scripts.scripts import main

RUNTIME_DIR_ENV = "ORCHESTRATOR_RUNTIME_ENV_DIR"

services.resolve_ip_for_localhost = lambda host: host
ray_constants.ENABLE_RAY_CLUSTER = True  # this process only: its children read the env var
if os.environ.get(RUNTIME_DIR_ENV):
    ray_constants.DEFAULT_RUNTIME_ENV_DIR_NAME = os.environ[RUNTIME_DIR_ENV]  # read when the node is made

if __name__ == "__main__":
    main()
