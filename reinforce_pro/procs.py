"""What every Ray actor process of a run sets up first, whatever it holds (an engine, a trainer rank): its
threads, its allocator's environment and where its output goes. Below rollout/ and workers/, which both use it.
"""

from __future__ import annotations

import os

import torch


def use_host_threads() -> None:
    """Ray sets OMP_NUM_THREADS to an actor's CPU share (1); in the synchronous pipeline each phase may use
    every core of a CPU host while the others wait. Under --async_train engines and trainer run at once, and
    the launcher gives each actor its share in REINFORCE_PRO_CPU_THREADS (run/actors.py: cpu_threads).
    OMP_NUM_THREADS is set too: vLLM's CPU worker reads it when it binds its threads (left at 1, its
    generation runs on one core)."""
    if not torch.cuda.is_available():
        threads = int(os.environ.get("REINFORCE_PRO_CPU_THREADS", os.cpu_count() or 1))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


# glibc's malloc hands large freed blocks back to the kernel, so every micro-batch's big temporaries (the LM head's
# logits, the layers' activations and their gradients) fault their pages in afresh; with these set at process start
# freed memory stays in the heap for the next micro-batch, as torch's caching allocator keeps CUDA memory. The CPU
# trainer ranks get them (run/actors.py; benchmarks/bench_train_phase.py measures what it saves). Both are
# needed (glibc 2.36, mallinfo2 after malloc): the mmap threshold puts blocks of 1-300 MiB in the heap (without it
# those over 32 MiB are always mmapped), and the trim threshold alone turns off glibc's adaptive threshold, so that
# every block over 128 KiB is mmapped.
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(2**32), "MALLOC_TRIM_THRESHOLD_": str(2**32)}

LOG_DIR_ENV = "REINFORCE_PRO_LOG_DIR"


def capture_output(name: str) -> None:
    """Send this actor's stdout and stderr, Python's and C's alike (vLLM, DeepSpeed, torch, NCCL), to
    $REINFORCE_PRO_LOG_DIR/<name>.log instead of Ray's stream to the driver's console. The launcher sets
    the variable unless --verbose; call first thing in an actor's __init__."""
    log_dir = os.environ.get(LOG_DIR_ENV)
    if not log_dir:
        return
    import sys

    os.makedirs(log_dir, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(os.path.join(log_dir, f"{name}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
