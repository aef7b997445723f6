"""A short per-GPU GEMM timing, for relative speed between nodes of one SKU (reference §6).

Needs torch with CUDA; anywhere else every GPU's speed is reported unknown. The node probe times
it once per probe start (:func:`once_per_boot`; the DaemonSet's pod starts with the node) and only
while every GPU is idle, so GPUs serving inference are never loaded by it.
"""

from __future__ import annotations

from collections.abc import Callable

from trainops.health.report import Signal


def once_per_boot(measure: Callable[[int], list[Signal]]) -> Callable[[int], list[Signal]]:
    """``measure`` until it has timed every GPU, then that result for as long as this process lives."""
    timed: list[Signal] = []

    def speeds(gpu_count: int) -> list[Signal]:
        if len(timed) != gpu_count:
            result = measure(gpu_count)
            if not all(speed.known for speed in result):
                return result
            timed[:] = result
        return list(timed)

    return speeds


def measure_gemm_tflops(gpu_count: int, size: int = 8192, iterations: int = 50) -> list[Signal]:
    """Dense bf16 matmul throughput of each GPU in TFLOP/s (timed with CUDA events after a warm-up)."""
    try:
        import torch
    except ImportError:
        return [Signal.unknown("torch is not installed")] * gpu_count
    if not torch.cuda.is_available():
        return [Signal.unknown("CUDA is not available to torch")] * gpu_count
    return [_measure_one(torch, index, size, iterations) for index in range(gpu_count)]


def _measure_one(torch, index: int, size: int, iterations: int) -> Signal:
    try:
        with torch.cuda.device(index):
            a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
            for _ in range(5):
                torch.matmul(a, b)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iterations):
                torch.matmul(a, b)
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1000.0
    except RuntimeError as err:
        return Signal.unknown(f"GEMM on GPU {index} failed: {err}")
    return Signal(round(2 * size**3 * iterations / seconds / 1e12, 1))
