"""The CPU as a condition of every figure (runfiles/cpu.py): read from
/proc/cpuinfo, kept in run.json's conditions (per host where the ranks'
hosts differ), a column of the runs table, named in the report and beside
each bench's figures."""

from pathlib import Path

import pandas as pd
import pytest

from analysis import conditions as report_conditions
from ddlcompare.run import conditions as run_conditions
from runfiles import cpu

XEON_PROCESSOR = """processor\t: {}
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
model name\t: Intel(R) Xeon(R) Gold 6130 CPU @ 2.10GHz
stepping\t: 4
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw
"""
# Two processors, as the kernel lists them: each field once per processor.
X86_AVX512 = "\n".join(XEON_PROCESSOR.format(n) for n in (0, 1))

AARCH64 = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40
CPU revision\t: 1
"""

NO_FLAGS = "processor\t: 0\nvendor_id\t: SomeVendor\n"
OLD_X86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse sse2\n"

EPYC_VM = {
    "model_name": "AMD EPYC",
    "vendor": "AuthenticAMD",
    "family": 25,
    "model": 1,
    "stepping": 1,
    "vector": "avx2",
    "hypervisor": True,
}
XEON = cpu.described(X86_AVX512)


@pytest.mark.skipif(not Path(cpu.CPUINFO).exists(), reason="no /proc/cpuinfo here")
def test_this_machine_is_read_from_proc_cpuinfo():
    """The real file: whatever it says, the same as its own flags line."""
    text = Path(cpu.CPUINFO).read_text()
    found = cpu.this_machine()
    flags = next(
        (
            line.split(":", 1)[1].split()
            for line in text.splitlines()
            if line.startswith(("flags", "Features"))
        ),
        [],
    )
    if "avx2" in flags and "avx512f" not in flags:
        assert found["vector"] == "avx2"
    if "flags" in text:  # x86 says whether a hypervisor runs it
        assert found["hypervisor"] is ("hypervisor" in flags)
        assert found["vendor"] and isinstance(found["family"], int)
    assert found is not cpu.this_machine()  # a copy each time: records may change theirs


def test_an_avx512_machine():
    assert XEON == {
        "model_name": "Intel(R) Xeon(R) Gold 6130 CPU @ 2.10GHz",
        "vendor": "GenuineIntel",
        "family": 6,
        "model": 85,
        "stepping": 4,
        "vector": "avx512f",
        "hypervisor": False,
    }
    assert cpu.token(XEON) == "Intel-Xeon-Gold-6130-CPU/avx512f"
    assert cpu.words(XEON).endswith(
        "(GenuineIntel family 6 model 85 stepping 4), avx512f, no hypervisor"
    )


def test_an_aarch64_machine_says_no_hypervisor_either_way():
    found = cpu.described(AARCH64)
    assert found == {
        "model_name": None,
        "vendor": "ARM",
        "family": 8,
        "model": 0xD40,
        "stepping": 1,
        "vector": "sve",
        "hypervisor": None,  # aarch64 has no such flag: unknown, not "no"
    }
    assert cpu.words(found) == "CPU (ARM family 8 model 3392 stepping 1), sve"
    assert cpu.token(found) == "unknown/sve"


def test_none_of_the_extensions_and_no_flags_at_all():
    assert cpu.described(OLD_X86)["vector"] == "none"
    assert "none of the vector extensions looked for" in cpu.words(cpu.described(OLD_X86))
    bare = cpu.described(NO_FLAGS)
    assert (bare["vector"], bare["hypervisor"]) == (None, None)
    assert cpu.words(cpu.described("")) == "unknown CPU"


def test_no_proc_cpuinfo_says_unknown(monkeypatch):
    monkeypatch.setattr(cpu, "CPUINFO", "/nonexistent/cpuinfo")
    cpu._read_once.cache_clear()
    try:
        found = cpu.this_machine()
    finally:
        cpu._read_once.cache_clear()
    assert found["vector"] is None and found["hypervisor"] is None
    assert cpu.words({**found, "model_name": None}) == "unknown CPU"
    assert cpu.token(found).endswith("/unknown")


def record(*ranks):
    return {"ranks": [{"hostname": host, "cpu": found, "cpus": [0]} for host, found in ranks]}


def test_a_run_on_one_cpu_and_a_run_across_two():
    same = run_conditions.of_run(record(("a", EPYC_VM), ("a", EPYC_VM)), Path("/nonexistent"))
    assert same["cpu"] == EPYC_VM
    mixed = record(("a", EPYC_VM), ("b", XEON))
    found = run_conditions.of_run(mixed, Path("/nonexistent"))
    assert found["cpu"] == {"per_host": {"a": EPYC_VM, "b": XEON}}
    # a host whose CPU no rank read (LBANN's other nodes) is said unknown
    partly = run_conditions.cpu_of({"a": [{"cpu": EPYC_VM}], "b": [{"cpu": None}]})
    assert partly == {"per_host": {"a": EPYC_VM, "b": None}}
    assert run_conditions.cpu_of({"a": [{"cpu": "AMD EPYC"}]}) is None  # an older rank's string


def test_the_runs_table_column_and_an_older_run_json():
    mixed = {**record(("a", EPYC_VM), ("b", XEON))}
    mixed["conditions"] = {"cpu": {"per_host": {"a": EPYC_VM, "b": XEON}}}
    column = report_conditions.columns(mixed)["cpu"]
    assert column.startswith(
        "a: AMD EPYC (AuthenticAMD family 25 model 1 stepping 1), avx2, virtual machine / b: Intel"
    )
    assert "cpu" in report_conditions.COLUMNS
    # older: no conditions' cpu, the first rank's model name; none at all: None
    assert (
        report_conditions.columns({"ranks": [{"cpu": "AMD EPYC"}], "conditions": {}})["cpu"]
        == "AMD EPYC"
    )
    assert report_conditions.columns({"conditions": {"cores_per_rank": [1, 1]}})["cpu"] is None
    assert report_conditions.columns({})["cpu"] is None


def runs(*cpus):
    return pd.DataFrame({"status": "ok", "cpu": list(cpus), "machine_cores": 2})


def test_the_report_names_the_cpu_and_says_when_runs_mix_cpus_before_any_figure():
    one = cpu.words(EPYC_VM)
    (line,) = report_conditions.lines(runs(one, one))
    assert line.startswith(f"Conditions of the 2 successful runs: CPU {one} (2 cores)")
    assert report_conditions.brief(runs(one)).endswith(f"CPU {one}")
    # resumed on another machine: two CPUs among the runs
    first, mixed = report_conditions.lines(runs(one, cpu.words(XEON)))
    assert "2 different CPUs (2 cores)" in first
    assert mixed.startswith("The runs were measured on 2 different CPUs (")
    assert "figures compared across them mix machines" in mixed
    # one run across two hosts of different CPUs counts both
    across = report_conditions.columns(
        {"conditions": {"cpu": {"per_host": {"a": EPYC_VM, "b": XEON}}}}
    )["cpu"]
    assert len(report_conditions.lines(runs(across))) == 2
    # a comparison: its own runs on one CPU, the runs compared with them on another
    said = report_conditions.brief(runs(one), compared=runs(one, cpu.words(XEON)))
    assert said.startswith("measured on 2 different CPUs") and "mix machines" in said


def test_an_older_results_folder_without_the_cpu_still_reports():
    older = pd.DataFrame({"status": ["ok"], "machine_cores": [2]})
    (line,) = report_conditions.lines(older)
    assert "a machine not recorded" in line
    assert "CPU" not in report_conditions.brief(older)


def test_a_bench_line_names_the_cpu():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import measuring

    token = cpu.token(cpu.this_machine())
    assert f" cpu={token}" in measuring.load_fields()
    assert measuring.load().endswith(f", cpu {token}")
    assert all("=" in field for field in measuring.load_fields().split())  # one word each
