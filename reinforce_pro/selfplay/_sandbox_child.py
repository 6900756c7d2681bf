"""Runs inside the sandbox process (started by sandbox.py as `python -I -S this_file`): the standard library
plus two kernel bindings (pyseccomp, landlock) loaded from paths the parent names; nothing from reinforce_pro.
Reads {"code", "entry", "input", "result_fd", ...limits} as JSON on stdin and writes one JSON line,
{"ok": true, "output": repr, "layers": [...]} or {"ok": false, "reason": ..., "layers": [...]}, on the
result fd; exits 0 after a success and 1 after a failure (the parent requires both to agree).

What confines the code is what it cannot reach, installed before the first untrusted byte runs and
irrevocable from inside:
1. the kernel: a Landlock ruleset (read-only access to the standard library and nothing else: no other file,
   no /proc, no write, truncate, rename or unlink anywhere) and a seccomp filter (no process or thread
   creation, no exec, no sockets, no signals to other processes, no ptrace or process_vm_*, no opening a
   file for writing, no file-system changes, no namespaces, no io_uring, no raising resource limits);
2. resource limits (CPU seconds, address space, file size, no core dumps);
3. the parent: a wall clock, a separate result pipe read with a cap, stdout and stderr sent to /dev/null,
   and the whole session killed afterwards.
The Python-level checks below (a syntax check, restricted builtins, an audit hook) are a cheap first filter
that turns most bad programs into a clear reason; code that reaches this module's globals can switch them
off, which is why nothing above depends on them.
"""

import ast
import builtins
import errno
import io
import json
import posix
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

# Denied with EPERM by the seccomp filter. Names unknown on this architecture (e.g. `open` on arm64) are
# skipped; REQUIRED_DENIALS must resolve, or the layer counts as not installed.
DENIED_SYSCALLS = (
    # processes, threads, programs
    "fork", "vfork", "clone", "execve", "execveat",
    # other processes: signals, tracing, memory
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open", "pidfd_send_signal",
    "pidfd_getfd", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    # network and IPC
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "shmget", "shmat", "msgget",
    "msgsnd", "semget", "mq_open",
    # file-system changes (opening for writing is filtered by flags below)
    "creat", "truncate", "ftruncate", "fallocate", "rename", "renameat", "renameat2", "unlink", "unlinkat",
    "rmdir", "mkdir", "mkdirat", "link", "linkat", "symlink", "symlinkat", "chmod", "fchmod", "fchmodat",
    "fchmodat2", "chown", "fchown", "lchown", "fchownat", "mknod", "mknodat", "utime", "utimes", "utimensat",
    "futimesat", "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
    "name_to_handle_at", "open_by_handle_at", "memfd_create", "fanotify_init",
    # the machine and the sandbox itself
    "setrlimit", "prlimit64", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "bpf",
    "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl",
    "add_key", "request_key", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "sethostname", "setdomainname", "iopl", "ioperm", "personality", "setuid", "setgid",
    "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "capset",
)  # fmt: skip
REQUIRED_DENIALS = ("clone", "execve", "socket", "kill", "ptrace", "openat", "truncate", "unlink")
WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC")


class Refused(Exception):
    pass


class Unconfined(Exception):
    """A required kernel layer could not be installed: nothing untrusted has run yet."""


def set_limits(limits: dict) -> None:
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(limits["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # no file may grow
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def restrict_files(landlock, readable: list[str]) -> str:
    """Landlock: every file-system access right is handled, and only reading beneath `readable` is granted."""
    ruleset = landlock.Ruleset()  # handles every access right this kernel's ABI knows
    ruleset.allow(*readable, rules=landlock.FSAccess.READ_FILE | landlock.FSAccess.READ_DIR)
    ruleset.apply()  # also sets no_new_privs
    return f"landlock-abi{landlock.landlock_abi_version()}"


def load_seccomp(seccomp) -> str:
    deny = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
        if number < 0 and name in REQUIRED_DENIALS:
            raise Unconfined(f"seccomp: syscall {name} not known on this architecture")
        if number >= 0:
            rules.add_rule(deny, number)
    for name, flags_arg in (("open", 1), ("openat", 2)):  # opening for writing or creating, by flag bits
        if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) < 0:
            continue
        for flag in WRITE_FLAGS:
            bit = getattr(posix, flag)
            rules.add_rule(deny, name, seccomp.Arg(flags_arg, seccomp.MASKED_EQ, bit, bit))
    # No threads either (clone is denied); clone3 and openat2 take their flags through a pointer the filter
    # cannot read: ENOSYS makes the C library fall back to clone / openat, which are filtered.
    for name in ("clone3", "openat2"):
        if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) >= 0:
            rules.add_rule(seccomp.ERRNO(errno.ENOSYS), name)
    rules.load()
    return "seccomp"


def confine(request: dict) -> tuple[list[str], list[str]]:
    """Install every layer this machine has; raise Unconfined if one the parent requires is missing.
    Both bindings are imported first: once Landlock is on, their files are no longer readable."""
    sys.path[:0] = request.get("library_paths", [])
    layers, problems = [], []
    bindings = {}
    for module in ("landlock", "pyseccomp"):
        try:
            bindings[module] = __import__(module)
        except Exception as e:  # noqa: BLE001 - e.g. libseccomp.so.2 missing: reported, not raised
            problems.append(f"import {module}: {type(e).__name__}: {e}")
    del sys.path[: len(request.get("library_paths", []))]
    set_limits(request)  # before seccomp, which denies setrlimit
    layers.append("rlimits")
    steps = (("landlock", lambda m: restrict_files(m, request["readable"])), ("pyseccomp", load_seccomp))
    for module, install in steps:
        if module in bindings:
            try:
                layers.append(install(bindings[module]))
            except Exception as e:  # noqa: BLE001 - a kernel without the feature is reported, not raised
                problems.append(f"{module}: {type(e).__name__}: {e}")
    missing = [name for name in request.get("require", ()) if not any(x.startswith(name) for x in layers)]
    if missing:
        raise Unconfined(f"could not install {', '.join(missing)} ({'; '.join(problems)[:300]})")
    return layers, problems


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


class CappedText(io.StringIO):
    """Where the code's prints go: kept up to MAX_PRINT_CHARS, the rest dropped."""

    def write(self, text: str) -> int:
        room = MAX_PRINT_CHARS - self.tell()
        return super().write(text[: max(room, 0)]) if room > 0 else len(text)


def run(request: dict) -> str:
    code, entry = request["code"], request["entry"]
    check_syntax(code)
    argument = ast.literal_eval(request["input"])
    for name in ALLOWED_MODULES:  # imported before the hook, so their own imports are not refused
        __import__(name)
    namespace = {"__builtins__": safe_builtins(), "__name__": "__sandbox__"}
    compiled = compile(code, "<sandbox>", "exec")  # before the hook, which refuses compile
    sys.addaudithook(audit)
    sys.stdout = sys.stderr = CappedText()
    exec(compiled, namespace)  # noqa: S102 - the point of this process
    func = namespace.get(entry)
    if not callable(func):
        raise Refused(f"the code defines no function {entry}()")
    output = repr(func(argument))
    if len(output) > int(request["max_output_chars"]):
        raise Refused(f"output repr is {len(output)} characters, over {request['max_output_chars']}")
    return output


def failure(e: BaseException) -> str:
    if isinstance(e, Refused):
        return f"refused: {e}"
    if isinstance(e, SyntaxError):
        return f"syntax error: {e.msg} (line {e.lineno})"
    if isinstance(e, MemoryError):
        return "memory limit exceeded"
    if isinstance(e, RecursionError):
        return "recursion limit exceeded"
    return f"raised {type(e).__name__}: {str(e)[:200]}"


def main() -> None:
    # Bound to locals before any untrusted byte runs: later rebinding of module globals does not reach them.
    write, exit_now, dumps = posix.write, posix._exit, json.dumps
    request = json.loads(sys.stdin.read())
    result_fd = int(request["result_fd"])
    layers: list[str] = []
    problems: list[str] = []
    try:
        layers, problems = confine(request)
        verdict = {"ok": True, "output": run(request)}
        status = 0
    except Unconfined as e:
        verdict, status = {"ok": False, "reason": f"sandbox not confined: {e}"}, 1
    except BaseException as e:  # noqa: BLE001 - any failure of user code is a verdict, not a crash
        verdict, status = {"ok": False, "reason": failure(e)}, 1
    verdict["layers"], verdict["problems"] = layers, problems
    frame = (dumps(verdict) + "\n").encode()
    while frame:
        frame = frame[write(result_fd, frame) :]
    exit_now(status)  # no interpreter shutdown: atexit and finalizers the code registered never run


if __name__ == "__main__":
    main()
