"""How much memory a device offers: the one budget every plan (the statistics engines, the
sweep's step, the kept composition) is checked against."""

from __future__ import annotations

import os

import torch

GB = 1e9
GPU_SAFETY = 0.9  # of the free accelerator memory (allocator fragmentation, CUDA context)
CPU_SAFETY = 0.8  # of MemAvailable (the page cache and other processes keep the rest)


def human_bytes(n: float) -> str:
    """1,234,567 -> "1.23 MB" (powers of 1000, as every plan line here)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def available_ram() -> float | None:
    """MemAvailable from /proc/meminfo, else free pages x page size; None if neither exists."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_budget(device: str) -> tuple[float | None, str]:
    """(usable bytes, how measured) on ``device``: free CUDA memory x GPU_SAFETY, or the host's
    available RAM x CPU_SAFETY; (None, why) when it cannot be measured."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return free * GPU_SAFETY, f"{free / GB:.1f} GB free on {device} x {GPU_SAFETY}"
    if dev.type == "cpu":
        avail = available_ram()
        if avail is not None:
            return avail * CPU_SAFETY, f"{avail / GB:.1f} GB RAM available x {CPU_SAFETY}"
    return None, f"free memory of {device} not measurable"
