"""Read untrusted DCP ``.metadata`` in a child process that a bomb can only kill itself.

A warm reader process (``_serve``: started once per process and kept, everything imported) forks a
fresh child for each ``.metadata``.  The child caps its own address space (``RLIMIT_AS``) and CPU time
(``RLIMIT_CPU``) before it touches the bytes (by default a base plus what metadata of that size needs: a
sharded run's ``.metadata`` grows with tensors x ranks), unpickles them at C speed with the restricted
unpickler of ``dcp_metadata`` (only inert stand-ins of DCP's own classes, each checking its arguments)
and answers the shard requirements as JSON.  Whatever one payload does ends with its child and becomes a
RefusedPickle naming the limit; the next checkpoint gets a fresh child.  The limits bound what no
unpickler bounds itself: memory (a huge memo index or length field, list bombs: ``MemoryError`` under
``RLIMIT_AS``), CPU (dict or set inserts of keys that hash alike are quadratic: killed at ``RLIMIT_CPU``)
and the C stack (hashing a key nested a million deep crashes the child, not the caller).  A wall-clock
timeout stops the reader itself.  The caller only waits on a pipe, so a triggerer that calls it through
``asyncio.to_thread`` keeps its event loop.
"""

from __future__ import annotations

import atexit
import fcntl
import gc
import json
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time

from trainops.checkpoints.formats import dcp_metadata
from trainops.checkpoints.formats.dcp_metadata import RefusedPickle, ShardRequirements
from trainops.errors import TemporaryError

MEMORY_LIMIT = 1 << 30
MEMORY_PER_BYTE = 16  # torch's metadata unpickles to ~13x its size (3.6 MiB: 72 MiB resident)
CPU_LIMIT_S = 10
CPU_S_PER_MIB = 0.5  # the restricted read takes ~0.04 s per MiB: a twelvefold margin
REQUEST = struct.Struct("!QQQ")  # memory limit, CPU seconds, length of the bytes that follow
REPLY = struct.Struct("!iQ")  # the child's wait status, length of its answer that follows
CHUNK = 1 << 20


def read_requirements(
    data: bytes, *, memory: int | None = None, cpu_s: int | None = None
) -> ShardRequirements:
    """What the ``.metadata`` bytes require of the shard files, read in a limited child process;
    raises RefusedPickle (a refused or fatal payload) or ValueError (not DCP metadata).

    Limits (bytes of address space, CPU seconds) default to ``MEMORY_LIMIT`` plus 16 bytes per byte
    of ``data`` and ``CPU_LIMIT_S`` plus half a second per MiB of it.
    """
    memory = MEMORY_LIMIT + MEMORY_PER_BYTE * len(data) if memory is None else memory
    cpu_s = CPU_LIMIT_S + int(CPU_S_PER_MIB * len(data) / (1 << 20)) if cpu_s is None else cpu_s
    status, answer = _READER.ask(memory, cpu_s, data, timeout_s=2 * cpu_s + 30)
    if status != 0:
        raise RefusedPickle(_death(status, memory, cpu_s))
    answer = json.loads(answer)
    if "refused" in answer:
        raise RefusedPickle(answer["refused"])
    if "error" in answer:
        raise ValueError(answer["error"])
    return ShardRequirements(answer["min_sizes"], answer["unstored_items"], answer["incomplete_tensors"])


def _death(status: int, memory: int, cpu_s: int) -> str:
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL):
        return f"its reader was killed past the {cpu_s} s CPU limit"
    if os.WIFSIGNALED(status):
        return f"its reader died of signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"its reader died (exit status {os.WEXITSTATUS(status)}, {memory >> 20} MiB memory limit)"


class _Reader:
    """The warm reader process, one per process (restarted after a fork, a timeout or its death);
    one request at a time."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.process: subprocess.Popen | None = None

    def ask(self, memory: int, cpu_s: int, data: bytes, timeout_s: float) -> tuple[int, bytes]:
        """The child's wait status and answer.  A reader that died since its last request is replaced
        once; one that cannot take a request or dies while a child reads is a ``TemporaryError`` (the
        machine, not the payload); past ``timeout_s`` the reader is stopped and the payload refused."""
        with self.lock:
            try:
                self._send(REQUEST.pack(memory, cpu_s, len(data)), data)
            except OSError:
                self.close()
                try:
                    self._send(REQUEST.pack(memory, cpu_s, len(data)), data)
                except OSError as error:
                    self.close()
                    raise TemporaryError(f"the .metadata reader cannot start: {error}") from None
            fd, deadline = self.process.stdout.fileno(), time.monotonic() + timeout_s
            try:
                status, length = REPLY.unpack(_read(fd, REPLY.size, deadline))
                return status, _read(fd, length, deadline)
            except TimeoutError:
                self.close()
                raise RefusedPickle(f"reading it took over {timeout_s:.0f} s and was stopped") from None
            except (OSError, EOFError) as error:
                self.close()
                raise TemporaryError(f"the .metadata reader stopped unexpectedly: {error}") from None

    def _send(self, header: bytes, data: bytes) -> None:
        fd = self._running().stdin.fileno()
        _write(fd, header)
        _write(fd, data)

    def _running(self) -> subprocess.Popen:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    "-c",
                    f"from {__name__} import _serve; _serve()",
                ],  # -P: no cwd on sys.path
                bufsize=0,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONHASHSEED": "random"},  # str keys that hash alike stay unguessable
                start_new_session=True,  # a timeout stops the reader and its child together
            )
            try:  # a 3.6 MiB .metadata in 4 writes, not 57
                fcntl.fcntl(self.process.stdin.fileno(), fcntl.F_SETPIPE_SZ, CHUNK)
            except OSError:
                pass  # above the system's pipe-max-size: the default size works, a little slower
        return self.process

    def close(self) -> None:
        """Stop the reader (and a child it is waiting for); a later read starts another."""
        with self.lock:
            process, self.process = self.process, None
            if process is None:
                return
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
            for pipe in (process.stdin, process.stdout):
                pipe.close()


def _read(fd: int, length: int, deadline: float) -> bytes:
    """Exactly ``length`` bytes from ``fd`` before ``deadline``; EOFError if it ends first."""
    chunks, missing = [], length
    while missing:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError
        chunk = os.read(fd, min(missing, CHUNK))
        if not chunk:
            raise EOFError("the reader ended its reply early")
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


_READER = _Reader()
stop_reader = _READER.close  # e.g. before measuring the children's peak memory
atexit.register(_READER.close)
os.register_at_fork(after_in_child=_READER.__init__)  # a forked process starts a reader of its own


# ---- the reader process ------------------------------------------------------------------


def _serve() -> None:
    """For each request on stdin: read the bytes, fork a child that reads them under its limits, and
    reply on stdout with the child's wait status and answer.  Ends when the caller closes stdin."""
    while header := _take(0, REQUEST.size):
        memory, cpu_s, length = REQUEST.unpack(header)
        data = _take(0, length)
        if len(data) < length:
            return  # the caller is gone
        answer_r, answer_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(answer_r)
            _child(data, memory, cpu_s, answer_w)
        os.close(answer_w)
        del data
        with os.fdopen(answer_r, "rb") as answers:
            answer = answers.read()
        _, status = os.waitpid(pid, 0)
        _write(1, REPLY.pack(status, len(answer)) + answer)


def _child(data: bytes, memory: int, cpu_s: int, answer_w: int) -> None:
    """Read ``data`` under the limits and write the answer to ``answer_w``; never returns."""
    try:
        os.close(0)
        os.close(1)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        gc.disable()  # the graph (~200k objects for 10,000 tensors) has no cycles: collecting triples the time
        try:
            metadata = dcp_metadata.load_metadata(data)
            requirements = dcp_metadata.shard_requirements(metadata)  # never freed: the child exits
            answer = {
                "min_sizes": requirements.min_sizes,
                "unstored_items": requirements.unstored_items,
                "incomplete_tensors": requirements.incomplete_tensors,
            }
        except RefusedPickle as error:
            answer = {"refused": str(error)[:2000]}
        except MemoryError:
            answer = {"refused": f"its reader ran out of its {memory >> 20} MiB memory limit"}
        except ValueError as error:
            answer = {"error": str(error)[:2000]}
        except Exception as error:  # noqa: BLE001 (whatever the bytes provoke is a refusal)
            answer = {"refused": f"its reader failed: {type(error).__name__}: {str(error)[:2000]}"}
        _write(answer_w, json.dumps(answer).encode())
    finally:
        os._exit(0)


def _take(fd: int, length: int) -> bytes:
    """Exactly ``length`` bytes from ``fd``; b"" when it ends first."""
    chunks, missing = [], length
    while missing:
        chunk = os.read(fd, min(missing, CHUNK))
        if not chunk:
            return b""
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
