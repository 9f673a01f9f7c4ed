"""The CPU a process runs on, as a condition of its figures.

The same model name can hide CPUs whose kernels differ: a virtual machine
that says only "AMD EPYC" and offers AVX2 but no AVX-512 ran the default
design's PyTorch and Horovod steps 1.5-1.7x slower than the machines the
documented figures came from, while TensorFlow's took the same time. So a
figure names the CPU's model, vendor and family/model/stepping (where the
kernel gives them), the widest vector extension among those the
frameworks' kernels are built for, and whether a hypervisor runs it.

Read from /proc/cpuinfo once per process (its first processor: one
machine's processors agree); where there is none, every field is None and
the words say "unknown". The hypervisor's vendor is left out: the kernel
tells it only on some hypervisors (lscpu asks the CPU itself).
"""

from __future__ import annotations

import functools
import platform

CPUINFO = "/proc/cpuinfo"
# Widest first: the first the CPU offers is its vector extension.
VECTOR_EXTENSIONS = {
    "x86": ("avx512f", "avx2", "avx", "sse4_2"),
    "arm": ("sve", "asimd"),
}
FIELDS = ("model_name", "vendor", "family", "model", "stepping", "vector", "hypervisor")


def this_machine() -> dict:
    """This machine's CPU (a copy: the caller may change it)."""
    return dict(_read_once())


@functools.cache
def _read_once() -> dict:
    """Read once: every rank record and bench line asks."""
    try:
        with open(CPUINFO) as text:
            return described(text.read())
    except OSError:
        return {**unknown(), "model_name": platform.processor() or None}


def unknown() -> dict:
    return dict.fromkeys(FIELDS)


def described(cpuinfo: str) -> dict:
    """The CPU a /proc/cpuinfo text describes. x86 and aarch64 name their
    fields differently; aarch64 has no hypervisor flag, so there it is
    unknown (None), as is the vector extension where no flags are listed."""
    first = _first_values(cpuinfo)
    x86_flags, arm_features = first.get("flags"), first.get("Features")
    flags = x86_flags if x86_flags is not None else arm_features
    return {
        "model_name": first.get("model name"),
        "vendor": first.get("vendor_id") or _arm_vendor(first.get("CPU implementer")),
        "family": _number(first.get("cpu family") or first.get("CPU architecture")),
        "model": _number(first.get("model") or first.get("CPU part")),
        "stepping": _number(first.get("stepping") or first.get("CPU revision")),
        "vector": None if flags is None else _widest_vector(set(flags.split())),
        "hypervisor": None if x86_flags is None else "hypervisor" in x86_flags.split(),
    }


def _first_values(cpuinfo: str) -> dict:
    """Each field's first value: the first processor's (aarch64 puts its
    model name after the last block, where the first value is the only one)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _widest_vector(flags: set[str]) -> str:
    """The widest extension offered, "none" where the CPU lists flags but
    none of those."""
    for extensions in VECTOR_EXTENSIONS.values():
        for extension in extensions:
            if extension in flags:
                return extension
    return "none"


# The implementer codes of the aarch64 CPUs a cluster is likely to have
# (the kernel gives only the code).
_ARM_IMPLEMENTERS = {"0x41": "ARM", "0x46": "Fujitsu", "0x48": "HiSilicon", "0x4e": "NVIDIA"}
_ARM_IMPLEMENTERS |= {"0x51": "Qualcomm", "0x61": "Apple", "0xc0": "Ampere"}


def _arm_vendor(code: str | None) -> str | None:
    if code is None:
        return None
    return _ARM_IMPLEMENTERS.get(code.lower(), f"implementer {code}")


def _number(text: str | None) -> int | str | None:
    """A cpuinfo number (decimal, or 0x hexadecimal on aarch64), else the text."""
    if text is None:
        return None
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return text


def words(cpu: dict | str | None) -> str | None:
    """The CPU in the report's words: "AMD EPYC (AuthenticAMD family 25
    model 1 stepping 1), avx2, virtual machine". A plain string is an older
    record's model name; None where nothing was recorded."""
    if cpu is None or isinstance(cpu, str):
        return cpu or None
    if not any(cpu.get(field) is not None for field in FIELDS):
        return "unknown CPU"
    ids = " ".join(
        f"{field} {cpu[field]}"
        for field in ("family", "model", "stepping")
        if cpu.get(field) is not None
    )
    maker = " ".join(str(part) for part in (cpu.get("vendor"), ids) if part)
    said = [f"{cpu.get('model_name') or 'CPU'}" + (f" ({maker})" if maker else "")]
    vector = cpu.get("vector")
    said.append(
        "vector extension unknown"
        if vector is None
        else "none of the vector extensions looked for"
        if vector == "none"
        else vector
    )
    if cpu.get("hypervisor") is not None:
        said.append("virtual machine" if cpu["hypervisor"] else "no hypervisor")
    return ", ".join(said)


def token(cpu: dict) -> str:
    """The CPU in one word for a bench's line: "AMD-EPYC/avx2/vm" (the
    model name without its trade marks and clock rate)."""
    name = (cpu.get("model_name") or "unknown").split(" @ ")[0]
    for mark in ("(R)", "(TM)", "(tm)"):
        name = name.replace(mark, "")
    name = "-".join(name.split())
    parts = [name, cpu.get("vector") or "unknown"]
    if cpu.get("hypervisor"):
        parts.append("vm")
    return "/".join(parts)
