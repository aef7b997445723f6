"""Read untrusted DCP ``.metadata`` in a child process that a bomb can only kill itself.

The child (``python -m trainops.checkpoints.formats.sandbox``) caps its own address space
(``RLIMIT_AS``) and CPU time (``RLIMIT_CPU``) before it reads a byte (by default a base plus what
metadata of that size needs: a sharded run's ``.metadata`` grows with tensors x ranks), pre-scans the pickle
(``pickle_scan``), unpickles it with the restricted unpickler and writes back the shard
requirements as JSON.  Its death (killed by the kernel for CPU, MemoryError, a wall-clock
timeout) becomes a RefusedPickle naming the limit.  The caller only waits on a pipe, so a
triggerer that calls it through ``asyncio.to_thread`` keeps its event loop.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys

from trainops.checkpoints.formats.dcp_metadata import RefusedPickle, ShardRequirements

MEMORY_LIMIT = 1 << 30
MEMORY_PER_BYTE = 16  # torch's metadata unpickles to ~13x its size (3.6 MiB: 72 MiB resident)
CPU_LIMIT_S = 120
CPU_S_PER_MIB = 1  # the pre-scan and the read take ~0.25 s per MiB


def read_requirements(
    data: bytes, *, memory: int | None = None, cpu_s: int | None = None
) -> ShardRequirements:
    """What the ``.metadata`` bytes require of the shard files, read in a limited child process;
    raises RefusedPickle (a refused or fatal payload) or ValueError (not DCP metadata).

    Limits (bytes of address space, CPU seconds) default to ``MEMORY_LIMIT`` plus 16 bytes per byte
    of ``data`` and ``CPU_LIMIT_S`` plus 1 s per MiB of it.
    """
    memory = MEMORY_LIMIT + MEMORY_PER_BYTE * len(data) if memory is None else memory
    cpu_s = CPU_LIMIT_S + CPU_S_PER_MIB * (len(data) >> 20) if cpu_s is None else cpu_s
    command = [sys.executable, "-P", "-m", __name__, str(memory), str(cpu_s)]  # -P: not the cwd on sys.path
    try:
        child = subprocess.run(command, input=data, capture_output=True, timeout=2 * cpu_s + 30, check=False)
    except subprocess.TimeoutExpired:
        raise RefusedPickle(f"reading it took over {2 * cpu_s + 30} s and was stopped") from None
    if child.returncode != 0:
        raise RefusedPickle(_death(child.returncode, child.stderr, memory, cpu_s))
    answer = json.loads(child.stdout)
    if "refused" in answer:
        raise RefusedPickle(answer["refused"])
    if "error" in answer:
        raise ValueError(answer["error"])
    return ShardRequirements(answer["min_sizes"], answer["unstored_items"], answer["incomplete_tensors"])


def _death(code: int, stderr: bytes, memory: int, cpu_s: int) -> str:
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return f"its reader was killed past the {cpu_s} s CPU limit"
    if b"MemoryError" in stderr:
        return f"its reader ran out of its {memory >> 20} MiB memory limit"
    return f"its reader died (exit status {code}): {stderr.decode(errors='replace')[-200:]}"


def _child(memory: int, cpu_s: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    from trainops.checkpoints.formats import dcp_metadata, pickle_scan

    data = sys.stdin.buffer.read()
    try:
        pickle_scan.scan(data)
        requirements = dcp_metadata.read_requirements(data)
        answer = {
            "min_sizes": requirements.min_sizes,
            "unstored_items": requirements.unstored_items,
            "incomplete_tensors": requirements.incomplete_tensors,
        }
    except RefusedPickle as error:
        answer = {"refused": str(error)}
    except ValueError as error:
        answer = {"error": str(error)}
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    _child(int(sys.argv[1]), int(sys.argv[2]))
