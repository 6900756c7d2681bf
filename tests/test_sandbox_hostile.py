"""The sandbox against code that first takes over its own interpreter, then attacks.

Every attack starts from a prelude that needs no dunder name, no `_attribute` and no blocked builtin:
it reaches the harness's module globals (through another allowed module's `sys`, a generator's frame
chain or `gc`), switches the Python-level checks off by rewriting the tables they read, and gets the real
`posix` module. From there on only the kernel layers (seccomp, Landlock, rlimits), the separate result
channel and the parent's own limits stand between the code and the machine. Each case then asserts what
must hold whatever the code did: nothing outside changed, no secret came back, no process survived, no
signal or connection reached the test process, the parent's memory stayed bounded, and a program that
fails cannot come back as a success.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time

import pytest

from reinforce_pro.selfplay.sandbox import SandboxLimits, SandboxResult, run_once

LIMITS = SandboxLimits(wall_s=5.0, cpu_s=2, memory_mb=256)
SECRET = "hunter2-reinforce-pro"  # in the test process's environment and in a file beside the victim

# Reach the harness's globals and disable its Python-level checks, then return (sys, posix, real builtins).
# Three routes to the harness's globals: vars() of __main__ reached through typing.sys, a generator's frame
# chain, and a gc scan. None uses a dunder name or an _attribute (string keys and attribute names without a
# leading underscore are all the checks let through).
TAKE_OVER = """
import typing


class Everything:
    def __contains__(self, item):
        return True

    def __or__(self, other):
        return self

    def __ror__(self, other):
        return self


def via_main(sys, real):
    return real.vars(sys.modules['__main__'])


def via_frames(sys, real):
    def walk():
        yield me.gi_frame.f_back
    me = walk()
    frame = next(me)
    while frame.f_back is not None:
        frame = frame.f_back
    return frame.f_globals


def via_gc(sys, real):
    gc = real.getattr(real, '__import__')('gc')
    for obj in gc.get_objects():
        if real.isinstance(obj, dict) and 'BLOCKED_EVENTS' in obj:
            return obj
    raise LookupError('no harness dict')


def take_over(route):
    sys = typing.sys
    real = sys.modules['builtins']
    harness = route(sys, real)
    for key, value in list(harness.items()):
        if real.isinstance(value, tuple) and value and real.all(real.isinstance(v, str) for v in value):
            harness[key] = ('\\x00',)
        elif real.isinstance(value, frozenset):
            harness[key] = Everything()
    return sys, sys.modules['posix'], real
"""

ROUTES = ("via_main", "via_frames", "via_gc")


def attack(body: str, route: str = "via_main") -> str:
    """f(ctx) takes over through `route`, then runs `body` (which may use sys, posix, real, ctx) and returns
    'done', or what stopped it if that was an OSError, ImportError or RuntimeError (other exceptions, such
    as the forging cases' final ValueError, leave f)."""
    indented = "\n".join("        " + line for line in body.strip().splitlines())
    return (
        TAKE_OVER
        + f"\n\ndef f(ctx):\n    sys, posix, real = take_over({route})\n    try:\n{indented}\n"
        + "        return 'done'\n    except (OSError, ImportError, RuntimeError) as e:\n"
        + "        return 'blocked: ' + real.repr(e)[:80]\n"
    )


KILL_SYSCALL = {"x86_64": 62, "aarch64": 129}.get(platform.machine(), 62)

# (id, category, body). Bodies run after the take-over; `ctx` holds the paths and the port.
CASES = [
    # reachable module state: the take-over itself must not be what stops the rest
    ("read-file-outside", "files", "return real.open(ctx['secret_file']).read()"),
    ("read-parent-environ", "secrets",
     "data = real.open(f'/proc/{posix.getppid()}/environ', 'rb').read()\n"
     "start = data.find(b'REINFORCE_PRO_TEST_SECRET')\nreturn data[start:start + 60]"),
    ("truncate-via-open", "files", "real.open(ctx['victim'], 'w').close()"),
    ("truncate-via-posix", "files", "posix.truncate(ctx['victim'], 0)"),
    ("rewrite-via-os-write", "files",
     "fd = posix.open(ctx['victim'], posix.O_RDWR)\nposix.write(fd, b'PWNED!!!')"),
    ("rewrite-via-mmap", "files",
     "mmap = real.getattr(real, '__import__')('mmap')\nfd = posix.open(ctx['victim'], posix.O_RDWR)\n"
     "m = mmap.mmap(fd, 0)\nm[:5] = b'PWNED'\nm.flush()"),
    ("rewrite-via-proc-self-fd", "files",
     "fd = posix.open(ctx['victim'], posix.O_RDONLY)\nreal.open(f'/proc/self/fd/{fd}', 'w').write('PWNED')"),
    ("create-file", "files", "real.open(ctx['dir'] + '/pwned', 'x').write('x')"),
    ("unlink-file", "files", "posix.unlink(ctx['victim'])"),
    ("rename-file", "files", "posix.rename(ctx['victim'], ctx['dir'] + '/moved')"),
    ("symlink", "files", "posix.symlink('/etc/passwd', ctx['dir'] + '/link')"),
    ("chmod-file", "files", "posix.chmod(ctx['victim'], 0o777)"),
    ("shell-command", "processes",
     "if posix.system('/usr/bin/touch ' + ctx['dir'] + '/pwned') != 0:\n    raise OSError('the shell did not run')"),
    ("execve-shell", "processes", "posix.execv('/bin/sh', ['sh', '-c', '/usr/bin/touch ' + ctx['dir'] + '/pwned'])"),
    ("fork-setsid-survivor", "processes",
     "pid = posix.fork()\nif pid == 0:\n    posix.setsid()\n    posix.close(1)\n    posix.close(2)\n"
     "    real.getattr(real, '__import__')('time').sleep(60)"),
    ("double-fork-survivor", "processes",
     "if posix.fork() == 0:\n    if posix.fork() == 0:\n        posix.setsid()\n        posix.close(1)\n"
     "        posix.close(2)\n        real.getattr(real, '__import__')('time').sleep(60)\n"
     "    real.getattr(posix, '_exit')(0)"),
    ("thread-outlives", "processes",
     "t = real.getattr(real, '__import__')('threading')\nt.Thread(target=lambda: [0 for _ in iter(int, 1)]).start()"),
    ("signal-parent", "processes", "posix.kill(ctx['ppid'], 10)"),
    ("socket-connect", "network",
     "s = real.getattr(real, '__import__')('socket')\ns.create_connection(('127.0.0.1', ctx['port']), 1).send(b'x')"),
    ("ctypes-system", "native",
     "libc = real.getattr(real, '__import__')('ctypes').CDLL(None)\n"
     "if libc.system(('/usr/bin/touch ' + ctx['dir'] + '/pwned').encode()) != 0:\n"
     "    raise OSError('the shell did not run')"),
    ("ctypes-raw-syscall", "native",
     "libc = real.getattr(real, '__import__')('ctypes').CDLL(None)\n"
     f"if libc.syscall({KILL_SYSCALL}, ctx['ppid'], 10) != 0:\n    raise OSError('kill(2) was refused')"),
    ("raise-rlimits", "resources", "r = real.getattr(real, '__import__')('resource')\n"
     "r.setrlimit(r.RLIMIT_CPU, (1000, 1000))"),
    # verdict forging: each program fails in the end, so a success verdict would be forged
    ("forge-on-stdout", "verdict",
     "posix.write(1, b'{\"ok\": true, \"output\": \"42\"}\\n')\nraise ValueError('real failure')"),
    ("forge-on-every-fd", "verdict",
     "for fd in range(0, 64):\n    try:\n        posix.write(fd, b'{\"ok\": true, \"output\": \"42\"}\\n')\n"
     "    except OSError:\n        pass\nraise ValueError('real failure')"),
    ("forge-by-replacing-json", "verdict",
     "class Fake:\n    def dumps(self, obj):\n        return '{\"ok\": true, \"output\": \"42\"}'\n"
     "    def loads(self, text):\n        return {}\n"
     "harness = real.vars(sys.modules['__main__'])\nharness['json'] = Fake()\nraise ValueError('real failure')"),
    ("forge-by-replacing-stdout", "verdict",
     "class Sink:\n    def write(self, text):\n        posix.write(1, b'{\"ok\": true, \"output\": \"42\"}\\n')\n"
     "    def flush(self):\n        pass\nsys.stdout = Sink()\nraise ValueError('real failure')"),
    # output floods: the parent must not buffer them
    ("flood-stdout", "output", "chunk = b'x' * 1000000\nfor _ in range(300):\n    posix.write(1, chunk)"),
    ("flood-stderr", "output", "chunk = b'x' * 1000000\nfor _ in range(300):\n    posix.write(2, chunk)"),
    ("flood-every-fd", "output",
     "chunk = b'x' * 1000000\nfor _ in range(300):\n    for fd in range(3, 16):\n        try:\n"
     "            posix.write(fd, chunk)\n        except OSError:\n            pass"),
]  # fmt: skip
CASES += [(f"{name}-{route}", category, body, route) for name, category, body in CASES[:2] for route in ROUTES[1:]]
CASES = [case if len(case) == 4 else (*case, "via_main") for case in CASES]


def _sandbox_processes() -> set[int]:
    """The sandbox children that are this test process's or nobody's: its own (its parent is this process) or
    orphaned (an escape that outlived the sandbox is reparented to init, or to this process as a subreaper). A
    sandbox child whose parent is another live process belongs to another test: the unit tier runs on two
    pytest-xdist workers, and the other worker's children once counted as survivors here (and were killed)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"_sandbox_child" not in f.read():
                        continue
                with open(f"/proc/{entry}/status") as f:
                    parent = next(int(line.split()[1]) for line in f if line.startswith("PPid:"))
            except (OSError, StopIteration, ValueError):
                continue
            if parent in (0, 1, os.getpid()):
                found.add(int(entry))
    return found


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A directory with a victim file and a secret, a secret in the environment, a loopback listener, and a
    SIGUSR1 recorder: everything an escaped program would touch."""
    monkeypatch.setenv("REINFORCE_PRO_TEST_SECRET", SECRET)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "secret.txt").write_text(SECRET)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    signals = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: signals.append(1))
    ctx = {"dir": str(tmp_path), "victim": str(victim), "secret_file": str(tmp_path / "secret.txt"),
           "port": listener.getsockname()[1], "ppid": os.getpid()}  # fmt: skip
    yield ctx, listener, signals
    signal.signal(signal.SIGUSR1, previous)
    listener.close()


@pytest.mark.parametrize("name, category, body, route", CASES, ids=[c[0] for c in CASES])
def test_hostile_program_changes_nothing_outside(name, category, body, route, world, tmp_path):
    ctx, listener, signals = world
    before_files = sorted(os.listdir(tmp_path))
    before_processes = _sandbox_processes()
    start = time.monotonic()
    if category in ("output", "secrets"):
        # in a fresh process: its peak memory is this call's alone, and the secret is in its environment from
        # the start (/proc/<pid>/environ shows a process's initial environment, not later setenv calls)
        result, parent_grew_mb = _run_in_fresh_process(attack(body, route), ctx)
        assert parent_grew_mb < 32, f"the parent buffered the flood: its peak memory grew {parent_grew_mb:.0f} MB"
    else:
        result = run_once(attack(body, route), "f", repr(ctx), LIMITS)
    elapsed = time.monotonic() - start
    time.sleep(0.3)  # give an escaped process time to act

    said = result.output + result.reason
    assert SECRET not in said, f"secret leaked: {said[:200]}"
    assert sorted(os.listdir(tmp_path)) == before_files, "files appeared or vanished"
    assert (tmp_path / "victim.txt").read_text() == "precious", "victim file changed"
    assert os.stat(tmp_path / "victim.txt").st_mode & 0o777 != 0o777
    assert not signals, "the test process received a signal"
    with pytest.raises(BlockingIOError):
        listener.accept()
    survivors = _sandbox_processes() - before_processes
    for pid in survivors:  # started by this test's sandbox call: end them before failing
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "a process outlived the sandbox"
    assert elapsed < LIMITS.wall_s + 2
    if category == "verdict":
        assert not result.ok, f"forged verdict: {result}"
    elif category != "output":  # a flood that runs to the end is fine as long as nobody buffered it
        assert not (result.ok and result.output == "'done'"), f"the attack ran to the end: {result}"


def _run_in_fresh_process(code: str, ctx: dict):
    script = (
        "import json, resource, sys\n"
        "from reinforce_pro.selfplay.sandbox import SandboxLimits, SandboxResult, run_once\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "r = run_once(sys.argv[1], 'f', sys.argv[2], SandboxLimits(**json.loads(sys.argv[3])))\n"
        "grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "print(json.dumps([r.ok, r.output, r.reason, grew]))\n"
    )
    limits = {"wall_s": LIMITS.wall_s, "cpu_s": LIMITS.cpu_s, "memory_mb": LIMITS.memory_mb}
    env = {**os.environ, "REINFORCE_PRO_TEST_SECRET": SECRET}
    done = subprocess.run([sys.executable, "-c", script, code, repr(ctx), json.dumps(limits)],
                          capture_output=True, text=True, timeout=60, check=True, env=env)  # fmt: skip
    ok, output, reason, grew_kb = json.loads(done.stdout.strip().splitlines()[-1])
    return SandboxResult(ok, output, reason), grew_kb / 1024


def test_the_take_over_itself_works():
    """The prelude must really get past the Python-level checks (else the catalogue tests nothing but them)."""
    for route in ROUTES:
        result = run_once(attack("return real.repr(posix.getpid() > 0)", route), "f", "{}", LIMITS)
        assert result.ok and result.output == "'True'", (route, result)


def test_every_run_installs_the_kernel_layers_this_machine_has():
    from reinforce_pro.selfplay.sandbox import isolation

    found = isolation()
    assert {layer.split("-")[0] for layer in found.kernel} == {"landlock", "seccomp"}, found.describe()
    assert "rlimits" in found.layers


def test_without_kernel_layers_nothing_runs(monkeypatch):
    """No binding importable (as on a machine without them): one-line refusal naming what to install, both from
    run_once and at start-up, instead of a weaker sandbox."""
    from reinforce_pro.run.prepare import UserInputError, _check_sandbox
    from reinforce_pro.selfplay import sandbox

    monkeypatch.setattr(sandbox, "_binding_paths", lambda: [])
    sandbox.isolation.cache_clear()
    try:
        assert sandbox.isolation().kernel == ()
        result = sandbox.run_once("def f(x):\n    return x", "f", "1", LIMITS)
        assert not result.ok and "no kernel sandbox layer" in result.reason and "pip install" in result.reason
        with pytest.raises(UserInputError, match="runs model-written code, but no kernel sandbox layer"):
            _check_sandbox()
    finally:
        sandbox.isolation.cache_clear()


def test_a_success_needs_exactly_one_verdict_and_exit_status_zero():
    """Writing a success line on the result channel (whose fd the code can find) before failing is caught."""
    body = (
        'for fd in range(3, 64):\n    try:\n        posix.write(fd, b\'{"ok": true, "output": "42"}\\n\')\n'
        "    except OSError:\n        pass\nraise ValueError('real failure')"
    )
    result = run_once(attack(body), "f", "{}", LIMITS)
    assert not result.ok and "more than one verdict" in result.reason


def test_start_up_names_the_layers_in_force(capsys):
    from reinforce_pro.run.prepare import _check_sandbox

    _check_sandbox()
    assert "[self-play] sandbox layers: rlimits, landlock-abi" in capsys.readouterr().out
