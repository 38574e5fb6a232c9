"""One of several processes over localhost (tests/test_distributed.py starts them): `Loop.draw`
deals the certified generator's chunks over the hosts and joins them in order, so every host
holds the boards (and the per-bucket counts of boards replaced) one process draws; a stop asked on
one host stops every host at the next round.

    python tests/boards_check.py PORT PID NPROC OUT  # writes OUT.PID: boards, counts, "stopped"
"""

import json
import sys

import jax

port, pid, nproc, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if nproc > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)

import configs.stage  # noqa: E402
from t2t_jax.env.config import EnvConfig  # noqa: E402
from t2t_jax.loop import Loop  # noqa: E402
from t2t_jax.perf import PhaseTimer  # noqa: E402
from t2t_jax.preemption import Preemption, Stopped  # noqa: E402

config = configs.stage.get_config("smoke")
config.env.chunk = 16  # (several chunks per host, so several rounds)
loop = Loop(config, None, None, Preemption(save=lambda run: None), PhaseTimer(), lambda run: None, lambda: None)
boards, replaced = loop.draw(EnvConfig.from_json(config.env.initial), loop.key(100, 0), 70)
lines = [json.dumps(boards), json.dumps(replaced)]
if nproc > 1 and pid == nproc - 1:
    loop.preemption.request()  # (the last host alone is signalled)
try:
    loop.boards(EnvConfig.from_json(config.env.initial), loop.key(100, 1), 70)
    lines.append("not stopped")
except Stopped:
    lines.append("stopped")
with open(f"{out}.{pid}", "w") as f:
    f.write("\n".join(lines))
