"""`python -m launch.mapf`: generate, show, validate, stats, and bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

CONFIG = '{"buckets": [{"size": [3, 5], "agents": 2, "hole_density": [0.0, 0.3]}]}'


def mapf(*args):
    return subprocess.run([sys.executable, "-m", "launch.mapf", *args], capture_output=True, text=True, timeout=300)


def test_generate_show_validate(tmp_path):
    boards = tmp_path / "boards.jsonl"
    out = mapf("generate", f"--config={CONFIG}", "--num=6", f"--out={boards}", "--seed=3")
    assert out.returncode == 0, out.stderr
    items = [json.loads(line) for line in boards.read_text().splitlines()]
    assert len(items) == 6 and all(3 <= b["size"] <= 5 and len(b["starts"]) == 2 for b in items)

    shown = mapf("show", f"--boards={boards}", "--limit=2")
    assert shown.returncode == 0 and shown.stdout.count("# board") == 2

    plans = tmp_path / "plans.jsonl"
    lines = [{"text": "Agent 0: STAY\nAgent 1: STAY"}] * 5 + [{"text": "I give up"}]
    plans.write_text("".join(json.dumps(p) + "\n" for p in lines))
    checked = mapf("validate", f"--boards={boards}", f"--plans={plans}")
    assert checked.returncode == 0, checked.stderr
    verdicts = [json.loads(line) for line in checked.stdout.splitlines()]
    assert len(verdicts) == 6
    assert all(not v["valid"] and v["parse_status"] == "ok" for v in verdicts[:5])  # starts != goals
    assert verdicts[5]["parse_error"] and verdicts[5]["parse_status"] == "no_answer"


def test_stats_and_errors(tmp_path):
    out = mapf("stats", f"--config={CONFIG}", "--num=256")
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.splitlines()[0])
    assert row["boards"] == 256 and row["candidates"] + row["corridors"] + row["line"] == pytest.approx(1)

    bad = mapf(
        "generate",
        '--config={"buckets": [{"size": 3, "agents": 5, "hole_density": 0.5}]}',
        f"--out={tmp_path / 'x.jsonl'}",
    )
    assert bad.returncode == 2 and "unsatisfiable" in bad.stderr
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("flag", ["--num=0", "--chunk=0", "--horizon=0", "--cell=100000", "--max_size=99"])
def test_out_of_range_flags_are_refused_before_any_work(tmp_path, flag):
    out = mapf("generate", f"--config={CONFIG}", f"--out={tmp_path / 'x.jsonl'}", flag)
    assert out.returncode != 0 and f"flag {flag}" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "x.jsonl").exists()


BOARD = {"size": 3, "holes": [[1, 1]], "starts": [[0, 0], [2, 2]], "goals": [[2, 2], [0, 0]]}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"size": "5"}, "size: '5' is not an integer"),
        ({"size": True}, "size: True is not an integer"),
        ({"size": 2}, "size: 2 is outside the legal range [3, 10]"),
        ({"starts": [[0, 0], [3, 0]]}, "starts[1]: [3, 0] is outside the 3x3 grid"),
        ({"starts": [[0, 0], [0, True]]}, "starts[1]: expected [row, col] integers"),
        ({"goals": [[1, 1], [0, 0]]}, "a start or goal lies on a hole"),
        ({"starts": [[0, 0], [0, 0]]}, "starts and goals must each be distinct cells"),
        ({"goals": [[2, 2]]}, "2 starts and 1 goals"),
        ({"bucket": "0"}, "bucket: '0' is not an integer"),
    ],
)
def test_bad_boards_name_file_line_and_field(tmp_path, change, message):
    boards, plans = tmp_path / "boards.jsonl", tmp_path / "plans.jsonl"
    boards.write_text(json.dumps(BOARD) + "\n\n" + json.dumps(BOARD | change) + "\n")  # the bad board: line 3
    plans.write_text('{"text": "Agent 0: STAY"}\n' * 2)
    out = mapf("validate", f"--boards={boards}", f"--plans={plans}")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {boards}:3: {message}"), lines
    assert out.stdout == ""


@pytest.mark.parametrize("command", ["show", "solve", "render"])
def test_every_subcommand_checks_the_boards(tmp_path, command):
    boards = tmp_path / "boards.jsonl"
    boards.write_text(json.dumps(BOARD | {"size": "5"}) + "\n")
    out = mapf(command, f"--boards={boards}", *([f"--out={tmp_path / 'out'}"] if command != "show" else []))
    assert out.returncode == 2 and f"{boards}:1: size: '5' is not an integer" in out.stderr, out.stderr
    assert out.stdout == "" and not (tmp_path / "out").exists()


def test_solve_writes_out_and_a_command_that_prints_refuses_it(tmp_path):
    boards = tmp_path / "boards.jsonl"
    boards.write_text(json.dumps(BOARD) + "\n")
    out = mapf("solve", f"--boards={boards}", f"--out={tmp_path / 'solved.jsonl'}", "--workers=1")
    assert out.returncode == 0 and out.stdout == "", out.stderr
    (solved,) = [json.loads(line) for line in (tmp_path / "solved.jsonl").read_text().splitlines()]
    assert solved["optimal_makespan"] >= 0 and not list(tmp_path.glob("*.tmp"))
    out = mapf("show", f"--boards={boards}", f"--out={tmp_path / 'shown'}")  # (it would have ignored --out)
    assert out.returncode != 0 and "--out: show prints to stdout" in out.stderr and not (tmp_path / "shown").exists()


@pytest.mark.parametrize(
    "boards_text, plans_text, message",
    [
        ("not json\n", "", "{boards}:1: not JSON (Expecting value at column 1)"),
        ("[1, 2]\n", "", "{boards}:1: expected a JSON object, got list"),
        (json.dumps(BOARD) + "\n", '{"text": "Agent 0: UP", "truncated": "no"}\n', "{plans}:1: truncated: 'no' is"),
        (json.dumps(BOARD) + "\n", '{"text": 7}\n', "{plans}:1: text: 7 is not a string"),
    ],
)
def test_bad_lines_and_plans_name_file_and_line(tmp_path, boards_text, plans_text, message):
    boards, plans = tmp_path / "boards.jsonl", tmp_path / "plans.jsonl"
    boards.write_text(boards_text)
    plans.write_text(plans_text)
    out = mapf("validate", f"--boards={boards}", f"--plans={plans}")
    assert out.returncode == 2 and message.format(boards=boards, plans=plans) in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_missing_inputs_and_bad_out_are_refused_before_any_work(tmp_path):
    missing = mapf("show", f"--boards={tmp_path / 'none.jsonl'}")
    assert missing.returncode == 2 and "No such file or directory" in missing.stderr
    assert "Traceback" not in missing.stderr
    for out, message in [
        (tmp_path / "no_dir" / "x.jsonl", "does not exist"),
        (tmp_path, "is a directory; give a file path"),
    ]:
        started = time.time()
        bad = mapf("generate", f"--config={CONFIG}", "--num=100000", f"--out={out}")
        assert bad.returncode == 2 and "--out: " in bad.stderr and message in bad.stderr, bad.stderr
        assert time.time() - started < 60  # refused before generating 100,000 certified boards
    (tmp_path / "file").write_text("")
    render = mapf("render", f"--boards={tmp_path / 'b.jsonl'}", f"--out={tmp_path / 'file'}")
    assert render.returncode == 2  # (the boards file is missing too: the first error is named)


def _validate_peak_mib(tmp_path, name, plans_text):
    """Runs `launch.mapf validate` on 100 boards and `plans_text`; -> (verdicts, the child's peak RSS in MiB)."""
    boards, plans, out = tmp_path / "boards.jsonl", tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out"
    boards.write_text((json.dumps(BOARD) + "\n") * 100)
    plans.write_text(plans_text)
    # The child sees at most two CPUs, plain malloc and the CPU backend: XLA's thread pools (and with
    # them the stacks and malloc arenas that transparent huge pages inflate) follow the CPU count.
    cpus = set(sorted(os.sched_getaffinity(0))[:2])
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "T2T_JAX_REEXEC": "0", "MALLOC_ARENA_MAX": "2"}
    with open(out, "w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launch.mapf", "validate", f"--boards={boards}", f"--plans={plans}"],
            stdout=stdout,
            env=env,
            preexec_fn=lambda: os.sched_setaffinity(0, cpus),
        )
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak memory
    assert os.waitstatus_to_exitcode(status) == 0
    return [json.loads(line) for line in out.read_text().splitlines()], usage.ru_maxrss / 1024


def test_validate_memory_is_bounded_by_the_parser_not_the_file(tmp_path):
    """One 3 MB plan line among 100 boards took 4 GB when the horizon followed the word count.
    Compared with the same boards' short plans in the same run: a process's baseline (jax, XLA's
    thread pools) follows the machine (a fixed 1,500 MiB bound failed on a CI machine at 2,118 MiB
    with 0.2 s of system time, too little to have touched 2 GB of arrays; the same command peaks at
    320 MiB on a 2-core machine, 2,037 MiB with the old horizon)."""
    stay = '{"text": "Agent 0: STAY"}\n'
    _, baseline = _validate_peak_mib(tmp_path, "short", stay * 100)
    long_line = json.dumps({"text": "Agent 0: " + "UP " * 1_000_000}) + "\n"
    verdicts, peak = _validate_peak_mib(tmp_path, "long", long_line + stay * 99)
    assert len(verdicts) == 100 and not verdicts[0]["valid"]
    assert peak - baseline < 512, (
        f"validate peaked at {peak:.0f} MiB, {peak - baseline:.0f} MiB over short plans' {baseline:.0f}"
    )


def _descendants(pid: int) -> set[int]:
    """The live descendants of `pid` (Linux /proc)."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, set()).add(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.add(child)
            todo.append(child)
    return found


def _alive(pids) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(pid)
        except OSError:
            pass
    return alive


@pytest.fixture(scope="module")
def hard_boards(tmp_path_factory):
    """4,000 uncertified 8-10 boards with 5 agents: minutes of solving for two workers."""
    boards = tmp_path_factory.mktemp("hard") / "boards.jsonl"
    hard = '{"buckets": [{"size": [8, 10], "agents": 5, "hole_density": [0.3, 0.5]}]}'
    assert mapf("generate", f"--config={hard}", "--num=4000", "--certify=false", f"--out={boards}").returncode == 0
    return boards


@pytest.mark.slow  # (the fixture's 4,000 boards and three solver pools: about a minute)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL, signal.SIGTERM])
def test_solver_workers_die_with_their_parent(tmp_path, hard_boards, sig):
    """Ctrl-C exits 130 within 10 s without a traceback; after it, SIGKILL or SIGTERM, no worker
    (nor multiprocessing's resource tracker) is left behind. SIGKILL and SIGTERM land as soon as
    the workers exist, before their initializer has run (the parent-death signal is not armed
    yet): they must notice the dead parent themselves."""
    stderr = tmp_path / "stderr"  # a file, not a pipe: a surviving worker cannot block the read
    with open(stderr, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launch.mapf", "solve", f"--boards={hard_boards}", "--workers=2"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,  # (a Ctrl-C reaches the whole foreground group: send it so)
        )
    workers = set()
    try:
        deadline = time.time() + 120
        while len(_descendants(proc.pid)) < 3 and time.time() < deadline:  # 2 workers + the tracker
            time.sleep(0.05)
        workers = _descendants(proc.pid)
        assert len(workers) >= 3 and proc.poll() is None
        if sig == signal.SIGINT:
            time.sleep(2)  # (solving)
        sent = time.time()
        os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)
        code = proc.wait(timeout=60)
        waited = time.time() - sent
        deadline = time.time() + 30
        while _alive(workers) and time.time() < deadline:
            time.sleep(0.2)
        assert not _alive(workers), f"left behind: {_alive(workers)}"
        if sig == signal.SIGINT:
            text = stderr.read_text()
            assert code == 130 and waited < 10 and "Traceback" not in text, (code, waited, text[-2000:])
    finally:
        for pid in _alive(workers | {proc.pid}):
            os.kill(pid, signal.SIGKILL)


# -- issue 31 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["show", "validate", "solve"])
def test_numbers_past_int64_and_deep_json_are_named_not_tracebacks(tmp_path, command):
    """OverflowError (show, solve) and RecursionError (validate's plans) before: now the file, the
    line and the field, with the legal range."""
    boards, plans = tmp_path / "boards.jsonl", tmp_path / "plans.jsonl"
    if command == "validate":
        boards.write_text(json.dumps(BOARD) + "\n")
        plans.write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
        message = f"{plans}:1: JSON nested deeper than 32 levels"
    else:
        boards.write_text(json.dumps(BOARD) + "\n" + json.dumps(BOARD | {"optimal_makespan": 2**64}) + "\n")
        message = f"{boards}:2: optimal_makespan: 18446744073709551616 is outside the legal range [0, 2147483647]"
    out = mapf(command, f"--boards={boards}", *([f"--plans={plans}"] if command == "validate" else []))
    assert out.returncode == 2 and "Traceback" not in out.stderr and message in out.stderr, out.stderr[-2000:]
    assert out.stdout == ""


def test_generate_refuses_a_size_given_as_a_string(tmp_path):
    """Converted to 4 and accepted before."""
    config = tmp_path / "env.json"
    config.write_text('{"buckets": [{"size": "4", "agents": 2}]}')
    out = mapf("generate", f"--config={config}", "--num=4", "--certify=false", f"--out={tmp_path / 'b.jsonl'}")
    assert out.returncode == 2 and f"error: {config}: buckets[0].size: '4' is not a number" in out.stderr, out.stderr
    assert not (tmp_path / "b.jsonl").exists()


@pytest.mark.parametrize("plans", [1, 3])
def test_render_refuses_other_plan_counts_than_boards_and_leaves_nothing(tmp_path, plans):
    """Rendered (the plans paired with the wrong boards, or some ignored) before."""
    boards, plan_file, out = tmp_path / "boards.jsonl", tmp_path / "plans.jsonl", tmp_path / "render" / "out"
    boards.write_text((json.dumps(BOARD) + "\n") * 2)
    plan_file.write_text('{"text": "Agent 0: STAY"}\n' * plans)
    done = mapf("render", f"--boards={boards}", f"--plans={plan_file}", f"--out={out}")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"--plans: {plan_file} holds {plans} plans for the 2 boards of {boards}" in done.stderr
    assert not (tmp_path / "render").exists()
