"""The memory risk of an elastic resume, named at the gate: the worst case on ``min_nodes`` (the run's peak
grown by nodes/min_nodes) against GFD's ``nvidia.com/gpu.memory`` of the smallest chosen GPU."""

from __future__ import annotations

import pytest

from trainops.health.memory import GPU_MEMORY_LABEL, MemoryFit, gpu_memory_mib

H100 = "81559"  # nvidia.com/gpu.memory of an H100 80GB HBM3 (MiB)


def node(name: str, memory: str | None = H100) -> dict:
    labels = {GPU_MEMORY_LABEL: memory} if memory is not None else {}
    return {"metadata": {"name": name, "labels": labels}}


def test_a_resume_that_fits_names_no_risk():
    # 30 GiB on 4 nodes is 60 GiB on 2: within an H100's 79.6 GiB
    assert MemoryFit(nodes=4, min_nodes=2, gpu_memory_gib=30).risk([node("a"), node("b")]) is None


def test_a_resume_that_may_not_fit_names_the_smallest_gpu_and_the_smallest_safe_min_nodes():
    chosen = [node("a"), node("l40s", "46068"), node("c")]
    warning = MemoryFit(nodes=4, min_nodes=2, gpu_memory_gib=20).risk(chosen)
    # 20 GiB x 4/2 = 40 GiB fits an L40S's 45 GiB; 30 x 4/2 = 60 does not, and 30 x 4/3 = 40 does
    assert warning is None
    warning = MemoryFit(nodes=4, min_nodes=2, gpu_memory_gib=30).risk(chosen)
    assert "min_nodes=2 of 4 nodes" in warning and "up to 60 GiB" in warning
    assert f"l40s: {GPU_MEMORY_LABEL}=46068" in warning and "set min_nodes >= 3" in warning


def test_a_run_that_does_not_fit_even_on_all_its_nodes_is_named_so():
    warning = MemoryFit(nodes=4, min_nodes=4, gpu_memory_gib=90).risk([node("a")])
    assert "may not fit" in warning and "gpu_memory_gib=90" in warning


def test_a_node_without_the_label_is_named_as_unchecked():
    warning = MemoryFit(nodes=4, min_nodes=2, gpu_memory_gib=30).risk([node("a"), node("bare", None)])
    assert warning.startswith("GPU memory not checked: bare lack(s)")


@pytest.mark.parametrize("value", ["9" * 40, "-81559", "80Gi", "0", "", " 81559"])
def test_a_label_the_node_wrote_badly_is_no_reading(value):
    assert gpu_memory_mib(node("a", value)) is None


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), True, "80"])
def test_a_bad_peak_is_refused_naming_the_field(value):
    with pytest.raises(ValueError, match="gpu_memory_gib must be"):
        MemoryFit(nodes=4, min_nodes=2, gpu_memory_gib=value)
