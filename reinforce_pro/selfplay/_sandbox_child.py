"""Runs inside the sandbox process (started by sandbox.py as `python -I -S this_file`): standard library
only, nothing from reinforce_pro. Reads {"code", "entry", "input", ...limits} as JSON on stdin, writes
{"ok": true, "output": repr} or {"ok": false, "reason": ...} as one JSON line on stdout.

Layers, each enough to stop a class of hostile code on its own, together defence in depth:
1. resource limits (CPU seconds, address space, file size, processes, no core dumps);
2. a syntax check: imports only from ALLOWED_MODULES, no dunder names or attributes, none of BLOCKED_NAMES;
3. restricted builtins (no open/exec/eval/compile/getattr..., a guarded __import__);
4. an audit hook (PEP 578, cannot be removed once installed) refusing file opens, process creation,
   sockets, ctypes and any new import outside the allow-list;
5. user prints go to a capped buffer, so only this file's JSON reaches the real stdout.
"""

import ast
import builtins
import io
import json
import resource
import sys

ALLOWED_MODULES = frozenset({
    "math", "cmath", "itertools", "functools", "collections", "heapq", "bisect", "string", "re", "operator",
    "statistics", "fractions", "decimal", "copy", "typing", "random",
})  # fmt: skip
BLOCKED_NAMES = frozenset({
    "open", "exec", "eval", "compile", "__import__", "input", "breakpoint", "globals", "locals", "vars",
    "getattr", "setattr", "delattr", "memoryview", "help", "exit", "quit", "object", "type", "super",
})  # fmt: skip
BLOCKED_EVENTS = (
    "open", "os.", "subprocess.", "socket.", "ctypes.", "shutil.", "sys._getframe", "code.", "pty.",
    "urllib.", "http.", "ftplib.", "smtplib.", "webbrowser.", "compile",
)  # fmt: skip
MAX_PRINT_CHARS = 10_000


class Refused(Exception):
    pass


def set_limits(limits: dict) -> None:
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(limits["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # no file may grow
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no fork (ignored for root; layers 2-4 still hold)


def check_syntax(code: str) -> None:
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for name in names:
                if name.split(".")[0] not in ALLOWED_MODULES:
                    raise Refused(f"import of {name!r} is not allowed")
        elif isinstance(node, ast.Name) and (node.id in BLOCKED_NAMES or node.id.startswith("__")):
            raise Refused(f"name {node.id!r} is not allowed")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            raise Refused(f"attribute {node.attr!r} is not allowed")
        elif isinstance(node, ast.Attribute) and node.attr in ("format", "format_map"):
            # "{0.__class__}".format(x) reads attributes the check above cannot see; f-strings are checked
            raise Refused(f"str.{node.attr} is not allowed (use an f-string)")
        elif isinstance(node, ast.Global | ast.Nonlocal):
            raise Refused("global/nonlocal statements are not allowed")


def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level != 0 or name.split(".")[0] not in ALLOWED_MODULES:
        raise Refused(f"import of {name!r} is not allowed")
    return __import__(name, globals, locals, fromlist, level)


def safe_builtins() -> dict:
    safe = {k: v for k, v in vars(builtins).items() if k not in BLOCKED_NAMES and not k.startswith("_")}
    safe["__build_class__"] = builtins.__build_class__  # class statements
    safe["__import__"] = guarded_import
    return safe


def audit(event: str, args) -> None:
    if event == "import" and args[0].split(".")[0] not in ALLOWED_MODULES | set(sys.builtin_module_names):
        raise Refused(f"import of {args[0]!r} is not allowed")
    if event.startswith(BLOCKED_EVENTS):
        raise Refused(f"operation {event!r} is not allowed")


def run(request: dict) -> dict:
    code, entry = request["code"], request["entry"]
    check_syntax(code)
    argument = ast.literal_eval(request["input"])
    for name in ALLOWED_MODULES:  # imported before the hook, so their own imports are not refused
        __import__(name)
    namespace = {"__builtins__": safe_builtins(), "__name__": "__sandbox__"}
    compiled = compile(code, "<sandbox>", "exec")  # before the hook, which refuses compile
    set_limits(request)
    sys.addaudithook(audit)
    real_stdout, sys.stdout = sys.stdout, io.StringIO()
    try:
        exec(compiled, namespace)  # noqa: S102 - the point of this process
        func = namespace.get(entry)
        if not callable(func):
            raise Refused(f"the code defines no function {entry}()")
        output = repr(func(argument))
    finally:
        sys.stdout = real_stdout
    if len(output) > int(request["max_output_chars"]):
        raise Refused(f"output repr is {len(output)} characters, over {request['max_output_chars']}")
    return {"ok": True, "output": output}


def main() -> None:
    request = json.loads(sys.stdin.read())
    try:
        result = run(request)
    except Refused as e:
        result = {"ok": False, "reason": f"refused: {e}"}
    except SyntaxError as e:
        result = {"ok": False, "reason": f"syntax error: {e.msg} (line {e.lineno})"}
    except MemoryError:
        result = {"ok": False, "reason": "memory limit exceeded"}
    except RecursionError:
        result = {"ok": False, "reason": "recursion limit exceeded"}
    except BaseException as e:  # noqa: BLE001 - any failure of user code is a verdict, not a crash
        result = {"ok": False, "reason": f"raised {type(e).__name__}: {str(e)[:200]}"}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
