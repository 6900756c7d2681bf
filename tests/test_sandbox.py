"""The sandbox against a catalogue of hostile code: each comes back as a failure with a reason, within its
limits, and nothing outside the sandbox's temporary directory changes."""

from __future__ import annotations

import os
import time

import pytest

from reinforce_pro.selfplay.sandbox import SandboxLimits, run_deterministic, run_once

LIMITS = SandboxLimits(wall_s=4.0, cpu_s=1, memory_mb=256)

HOSTILE = [
    pytest.param("def f(x):\n    while True:\n        pass", "CPU time", id="infinite-loop"),
    pytest.param("import os\ndef f(x):\n    while True:\n        os.fork()", "import of 'os'", id="fork-bomb"),
    pytest.param("def f(x):\n    return [0] * (10**10)", "memory", id="huge-allocation"),
    pytest.param("def f(x):\n    s = 'x'\n    while True:\n        s = s + s", "memory", id="growing-allocation"),
    pytest.param("import shutil\ndef f(x):\n    shutil.rmtree(x)", "import of 'shutil'", id="delete-tree"),
    pytest.param(
        "import socket\ndef f(x):\n    return socket.create_connection(('1.1.1.1', 80))", "socket", id="socket"
    ),
    pytest.param("import os\ndef f(x):\n    return os.system('touch pwned')", "import of 'os'", id="os-system"),
    pytest.param("def f(x):\n    return open('/etc/passwd').read()", "name 'open'", id="read-secret-open"),
    pytest.param("def f(x):\n    return __import__('os').environ", "'__import__'", id="dunder-import"),
    pytest.param("def f(x):\n    return ().__class__.__base__.__subclasses__()", "attribute", id="subclasses-walk"),
    pytest.param("def f(x):\n    return '{0.__class__}'.format(x)", "str.format", id="format-escape"),
    pytest.param("def f(x):\n    return eval('1+1')", "name 'eval'", id="eval"),
    pytest.param("def f(x):\n    g = f.__globals__\n    return g", "attribute '__globals__'", id="globals"),
    pytest.param("import random\ndef f(x):\n    return random.random()", "non-deterministic", id="random"),
    pytest.param("def f(x):\n    return list({'a', 'b', 'c', 'd', 'e', 'f'})", "non-deterministic", id="hash-order"),
    pytest.param("def f(x):\n    return f(x)", "recursion", id="recursion"),
    pytest.param("def f(x)\n    return 1", "syntax error", id="syntax-error"),
    pytest.param("def g(x):\n    return 1", "no function f", id="no-entry"),
    pytest.param("def f(x):\n    return 'y' * 5000", "output repr", id="huge-output"),
]


@pytest.mark.parametrize("code, reason", HOSTILE)
def test_hostile_code_is_refused_with_a_reason(code, reason, tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("precious")
    before = sorted(os.listdir(tmp_path))
    start = time.monotonic()
    result = run_deterministic(code, "f", repr(str(tmp_path)), LIMITS)
    assert not result.ok
    assert reason in result.reason, result.reason
    assert time.monotonic() - start < 2 * LIMITS.wall_s + 2
    assert sorted(os.listdir(tmp_path)) == before and victim.read_text() == "precious"


def test_wall_clock_limit_kills_the_process_group():
    limits = SandboxLimits(wall_s=1.0, cpu_s=30)  # only the wall clock can stop it
    start = time.monotonic()
    result = run_once("def f(x):\n    while True:\n        pass", "f", "0", limits)
    assert not result.ok and "wall-clock" in result.reason
    assert time.monotonic() - start < 3


@pytest.mark.parametrize(
    "code, argument, output",
    [
        pytest.param("def f(x):\n    return sorted(x)[::-1]", "[3, 1, 2]", "[3, 2, 1]", id="list"),
        pytest.param("import math\ndef f(n):\n    return math.comb(n, 2)", "5", "10", id="allowed-import"),
        pytest.param("class A:\n    k = 2\ndef f(x):\n    return A.k * x", "4", "8", id="class"),
        pytest.param("def f(x):\n    print('noise')\n    return f'{x}!'", "'hi'", "'hi!'", id="print-is-swallowed"),
        pytest.param("def f(d):\n    return sorted(set(d))", "[3, 3, 1]", "[1, 3]", id="sorted-set"),
    ],
)
def test_ordinary_code_runs(code, argument, output):
    result = run_deterministic(code, "f", argument, LIMITS)
    assert result.ok, result.reason
    assert result.output == output
