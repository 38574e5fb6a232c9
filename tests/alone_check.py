"""One of two processes over localhost (tests/test_distributed.py starts them): host 1 fails on
its own and ends through `distributed.exit_alone` while host 0 waits for it in a collective; host
0 is ended within the heartbeat timeout instead of waiting forever.

    python tests/alone_check.py PORT PID
"""

import sys

import jax

port, pid = int(sys.argv[1]), int(sys.argv[2])
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid, heartbeat_timeout_seconds=10)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from t2t_jax import distributed  # noqa: E402

multihost_utils.process_allgather(np.int32(pid))
if pid == 1:
    try:
        raise RuntimeError("host 1 alone")
    except RuntimeError as e:
        distributed.exit_alone(e)
multihost_utils.process_allgather(np.int32(pid))  # (host 1 never comes)
multihost_utils.sync_global_devices("never reached")
print("host 0 went on", flush=True)
