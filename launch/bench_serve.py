"""A bounded load test of `launch.serve`: N clients x T seconds against a server it starts on
127.0.0.1 (the embedded tiny model, random weights), printing one JSON line.

    python -m launch.bench_serve --clients=64 --seconds=30 --max_tokens=8

Each client sends greedy chat completions back to back on its own keep-alive connection (a
distinct short prompt each); a prober asks GET /health and GET /v1/models every 50 ms all the
while. Reports requests/s (answered 200), p50/p99 latency of those, 429s (the bounded queue's
refusals, with Retry-After honoured by the client before its next request), other errors, and
the health and model-listing latency p50/p99/max under that load. The server is stopped at the
end (and on Ctrl-C).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time

from absl import app, flags

from launch.faults_serving import free_port, start_server  # (no flags there)

_CLIENTS = flags.DEFINE_integer("clients", 16, "Concurrent clients.", lower_bound=1, upper_bound=1024)
_SECONDS = flags.DEFINE_float("seconds", 30.0, "Seconds of load.", lower_bound=1.0, upper_bound=3600.0)
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 8, "max_tokens of each request.", lower_bound=1, upper_bound=4096)
_MAX_QUEUE = flags.DEFINE_integer("max_queue", 64, "The server's --max_queue.", lower_bound=1)
_OUT = flags.DEFINE_string("out", None, "Also write the JSON here.")


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


PROBE = """
import http.client, json, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
stop = time.monotonic() + seconds
health, models = [], []
while time.monotonic() < stop:
    for path, out in (("/health", health), ("/v1/models", models)):
        start = time.monotonic()
        try:
            conn = http.client.HTTPConnection(host, port, timeout=10)
            conn.request("GET", path)
            r = conn.getresponse()
            r.read()
            conn.close()
            out.append(time.monotonic() - start if r.status == 200 else 1e9)
        except OSError:
            out.append(1e9)
    time.sleep(0.05)
print(json.dumps([health, models]))
"""


def load(addr, clients: int, seconds: float, max_tokens: int) -> dict:
    """Drive `clients` clients for `seconds` and probe health meanwhile -> the figures."""
    stop = time.monotonic() + seconds
    lock = threading.Lock()
    latencies, statuses = [], {}

    def client(i):
        conn = None
        k = 0
        while time.monotonic() < stop:
            body = json.dumps(
                {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": f"client {i} request {k}"}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                }
            )
            k += 1
            start = time.monotonic()
            try:
                conn = conn or http.client.HTTPConnection(*addr, timeout=120)
                conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                status, wait = r.status, r.headers.get("Retry-After")
            except OSError as e:
                status, wait = type(e).__name__, None
                conn = None
            took = time.monotonic() - start
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
                if status == 200:
                    latencies.append(took)
            if status == 429 and wait:
                time.sleep(min(float(wait), max(stop - time.monotonic(), 0)))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    probe = subprocess.Popen(  # (its own process: its timings are the server's, not this one's 64 threads')
        [sys.executable, "-c", PROBE, addr[0], str(addr[1]), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - began
    health, models = json.loads(probe.communicate(timeout=120)[0])
    ms = lambda x: None if x is None else round(x * 1000, 1)  # noqa: E731
    ok = statuses.get(200, 0)
    return {
        "clients": clients,
        "seconds": round(wall, 1),
        "max_tokens": max_tokens,
        "requests_ok": ok,
        "requests_per_s": round(ok / wall, 2),
        "tokens_per_s": round(ok * max_tokens / wall, 1),
        "p50_ms": ms(pct(latencies, 0.5)),
        "p99_ms": ms(pct(latencies, 0.99)),
        "rejected_429": statuses.get(429, 0),
        "errors": sum(v for k, v in statuses.items() if k not in (200, 429)),
        "statuses": {str(k): v for k, v in statuses.items()},
        "health_probes": len(health),
        "health_p50_ms": ms(pct(health, 0.5)),
        "health_p99_ms": ms(pct(health, 0.99)),
        "health_max_ms": ms(max(health, default=None)),
        "models_p99_ms": ms(pct(models, 0.99)),
        "models_max_ms": ms(max(models, default=None)),
    }


def main(argv):
    del argv
    port = free_port()
    proc = start_server(port, f"--max_queue={_MAX_QUEUE.value}")
    addr = ("127.0.0.1", port)
    try:
        warm = json.dumps({"messages": [{"role": "user", "content": "warm up"}], "max_tokens": _MAX_TOKENS.value})
        for _ in range(2):  # (the first decode compiles)
            conn = http.client.HTTPConnection(*addr, timeout=300)
            conn.request("POST", "/v1/chat/completions", body=warm, headers={"Content-Type": "application/json"})
            conn.getresponse().read()
            conn.close()
        result = load(addr, _CLIENTS.value, _SECONDS.value, _MAX_TOKENS.value)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    result["max_queue"] = _MAX_QUEUE.value
    line = json.dumps(result)
    print(line, flush=True)
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    app.run(main)
