"""What this CPU offers a low precision, and which kernel torch runs a product with.

Whether bfloat16 runs faster than float32 on a CPU depends on its units and its maker. AMX
tiles (`amx_bf16`) run it faster on any CPU. AVX-512's bfloat16 dot products alone
(`avx512_bf16`, no AMX) run it natively, faster than float32 on an AMD EPYC (Zen 4: the dot
product does twice float32's multiply-adds per cycle) and slower on an Intel Xeon. With
neither, torch emulates it, many times slower. float16 likewise with `amx_fp16` /
`avx512_fp16`. The benchmarks say which the machine has and name the kernel a product ran
on (oneDNN's verbose log), so a speed figure comes with the reason for it.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import torch

FLAGS = ("amx_bf16", "amx_fp16", "amx_tile", "avx512_bf16", "avx512_fp16", "avx512f")

# The instructions that run a low precision's products natively (any one suffices); without
# them torch emulates the dtype, many times slower than float32 (docs/precision.md).
LOW_PRECISION_UNITS: dict[torch.dtype, tuple[str, ...]] = {
    torch.bfloat16: ("amx_bf16", "avx512_bf16"),
    torch.float16: ("amx_fp16", "avx512_fp16"),
}
# Those with which a low precision ran faster than float32, by `cpu_vendor()` ("": any other).
# With only the vector ones, an AVX-512 Xeon without AMX trained at 0.57-0.62x float32's speed
# in bfloat16 and 0.82x in float16, its bfloat16 beam search at 0.65-0.70x; an AMD EPYC
# (Zen 4) trained at 1.50-1.61x in bfloat16, its beam search at 1.46-1.55x (docs/precision.md).
FASTER_THAN_FLOAT32_UNITS: dict[torch.dtype, dict[str, tuple[str, ...]]] = {
    torch.bfloat16: {"": ("amx_bf16",), "AuthenticAMD": ("amx_bf16", "avx512_bf16")},
    torch.float16: {"": ("amx_fp16",)},
}


def faster_than_float32_units(dtype: torch.dtype, vendor: str) -> tuple[str, ...]:
    """The flags any one of which makes `dtype`'s products faster than float32's on a CPU of
    `vendor`."""
    by_vendor = FASTER_THAN_FLOAT32_UNITS[dtype]
    return by_vendor.get(vendor, by_vendor[""])


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux: /proc/cpuinfo; elsewhere none)."""
    return set(_cpuinfo_field("flags").split())


def cpu_vendor() -> str:
    """The CPU's vendor id ('GenuineIntel', 'AuthenticAMD'; Linux only, elsewhere '').
    MKL picks its float32 kernels by it, so which product form is fastest depends on it."""
    return _cpuinfo_field("vendor_id").strip()


def rule_key(vendor: str, flags: set[str] | frozenset[str] = frozenset()) -> str:
    """The key by which the measured rules (`nmt.translate.output_layer.RULES`,
    `nmt.wide_linear.BLOCK_ROWS`) know a CPU: its vendor, and for AMD whether it has AVX-512
    (which oneDNN uses and MKL does not)."""
    return f"{vendor} avx512f" if vendor == "AuthenticAMD" and "avx512f" in flags else vendor


@functools.cache
def this_cpu() -> str:
    """This CPU's `rule_key` (read once: the nodes of every clone ask it)."""
    return rule_key(cpu_vendor(), cpu_flags())


def _cpuinfo_field(name: str) -> str:
    """The first value of `name` in /proc/cpuinfo, '' where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value
    return ""


def matmul_kernel(dtype: torch.dtype, n: int = 64) -> str:
    """The oneDNN implementation an n x n product in `dtype` runs on (e.g.
    'brg_matmul:avx10_1_512_amx'), or 'not oneDNN' where torch uses another library (MKL
    for float32)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    with tempfile.TemporaryFile() as log:
        saved = os.dup(1)
        os.dup2(log.fileno(), 1)  # oneDNN writes its log to the process's stdout
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                torch.mm(a, b)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        text = log.read().decode(errors="replace")
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) > 6 and fields[2:6] == ["primitive", "exec", "cpu", "matmul"]:
            return fields[6]
    return "not oneDNN"


def describe() -> str:
    """One line: the vendor, torch's CPU capability, the low-precision flags, the products'
    kernels."""
    flags = cpu_flags()
    have = ", ".join(f for f in FLAGS if f in flags) or "none of " + ", ".join(FLAGS)
    kernels = "; ".join(
        f"{name} matmul: {matmul_kernel(dtype)}"
        for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16))
    )
    vendor = cpu_vendor() or "vendor unknown"
    capability = torch.backends.cpu.get_cpu_capability()
    return f"CPU: {vendor}, torch capability {capability}, {have}; {kernels}"
