import shutil

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils import vllm_cpu_topology
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_topology import (
    ISA_KEYS,
    TopologyError,
    detect_arch,
    group_cores,
    identify_cpu,
    isa_class,
    parse_cpuinfo,
    parse_distance,
    parse_isa,
    parse_meminfo_kib,
    parse_memory_limit,
    parse_status_cpus,
    read_cpu_facts,
    read_text,
)
from ansible_collections.vllm.cpu_fleet.tests.conftest import MACHINE_NAMES, load_expected_facts

S390X_CPUINFO = """vendor_id       : IBM/S390
# processors    : 2
bogomips per cpu: 3241.00
max thread id   : 0
features\t: esan3 zarch stfle msa ldisp eimm dfp edat etf3eh highgprs te vx vxd vxe gs vxe2 vxp sort dflt sie
facilities      : 0 1 2 3 4 6 7 8 9 10 12 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 30 31 32 33
processor 0: version = FF,  identification = 0133E8,  machine = 8561
processor 1: version = FF,  identification = 0133E8,  machine = 8561

cpu number      : 0
cpu MHz dynamic : 5200
cpu MHz static  : 5200

cpu number      : 1
cpu MHz dynamic : 5200
cpu MHz static  : 5200
"""

PPC64LE_CPUINFO = """processor\t: 0
cpu\t\t: POWER9 (raw), altivec supported
clock\t\t: 2300.000000MHz
revision\t: 2.2 (pvr 004e 1202)

timebase\t: 512000000
platform\t: PowerNV
model\t\t: 9006-22P
machine\t\t: PowerNV 9006-22P
"""

ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""


def _blocks_with_flags(*flag_lines):
    return parse_cpuinfo(
        "\n\n".join(f"processor\t: {i}\nvendor_id\t: GenuineIntel\nflags\t\t: {f}" for i, f in enumerate(flag_lines))
    )


# ---------------------------------------------------------------- fixtures


@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_fixture_facts_match_expected(machine_root, name):
    assert read_cpu_facts(str(machine_root(name))) == load_expected_facts(name)


def test_all_required_machines_are_recorded():
    assert len(MACHINE_NAMES) >= 11


def test_fixture_isa_classes_cover_every_x86_and_arm_class():
    classes = {load_expected_facts(n)["isa_class"] for n in MACHINE_NAMES}
    assert classes >= {
        "x86_64-amx",
        "x86_64-avx512bf16",
        "x86_64-avx512vnni",
        "x86_64-avx512",
        "x86_64-avx2",
        "aarch64-bf16",
    }


def test_core_id_is_only_unique_per_package(machine_root):
    # SPR: both packages use core_id 0-55; the second socket's first core is 56+168.
    facts = read_cpu_facts(str(machine_root("spr-2s-amx")))
    assert facts["numa_nodes"][1]["cores"][0] == [56, 168]
    assert sum(len(n["cores"]) for n in facts["numa_nodes"]) == 112


def test_vanished_topology_dir_excludes_cpu(machine_root):
    # A CPU listed online whose topology dir is gone went offline meanwhile.
    root = machine_root("vm-2vcpu-nonuma")
    shutil.rmtree(root / "sys/devices/system/cpu/cpu1/topology")
    facts = read_cpu_facts(str(root))
    assert facts["online_cpus"] == [0]
    assert facts["numa_nodes"][0]["cores"] == [[0]]


def test_arch_override(machine_root):
    root = machine_root("vm-2vcpu-nonuma")
    (root / "proc/cpuinfo").write_text("processor\t: 0\n\nprocessor\t: 1\n")
    with pytest.raises(TopologyError, match="cannot infer the architecture"):
        read_cpu_facts(str(root))
    # Told it is x86_64, a cpuinfo without flags still cannot say which ISA (it used
    # to be classed x86_64-avx2, a guess that picks a wheel the CPU may not run).
    with pytest.raises(TopologyError, match="no flags line on x86_64"):
        read_cpu_facts(str(root), arch="x86_64")
    (root / "proc/cpuinfo").write_text("processor\t: 0\nflags\t: avx2\n\nprocessor\t: 1\nflags\t: avx2\n")
    facts = read_cpu_facts(str(root), arch="x86_64")
    assert (facts["arch"], facts["isa_class"]) == ("x86_64", "x86_64-avx2")
    with pytest.raises(ValueError, match="arch must be one of"):
        read_cpu_facts(str(root), arch="riscv64")


def test_cgroup_v1_limit_and_cpuset(machine_root):
    root = machine_root("spr-2s-amx")
    (root / "sys/fs/cgroup/cpuset").mkdir(parents=True)
    (root / "sys/fs/cgroup/memory").mkdir()
    (root / "sys/fs/cgroup/cpuset/cpuset.cpus").write_text("0-3,112-115\n")
    (root / "sys/fs/cgroup/memory/memory.limit_in_bytes").write_text("17179869184\n")
    facts = read_cpu_facts(str(root))
    assert facts["cgroup"] == {
        "version": 1,
        "cpus": [0, 1, 2, 3, 112, 113, 114, 115],
        "mems": None,
        "memory_max_mib": 16384,
        "cpu_limit": None,
    }
    assert facts["memory_mib"] == 16384
    assert facts["numa_nodes"][0]["cores"] == [[0, 112], [1, 113], [2, 114], [3, 115]]
    assert facts["numa_nodes"][1]["cpus"] == []


def test_cgroup_narrower_than_affinity(machine_root):
    root = machine_root("milan-container-cpuset")
    (root / "sys/fs/cgroup/cpuset.cpus.effective").write_text("9,137\n")
    assert read_cpu_facts(str(root))["allowed_cpus"] == [9, 137]


def test_empty_cgroup_cpuset_means_unrestricted(machine_root):
    root = machine_root("milan-container-cpuset")
    (root / "sys/fs/cgroup/cpuset.cpus.effective").write_text("\n")
    facts = read_cpu_facts(str(root))
    assert facts["cgroup"]["cpus"] is None
    assert facts["allowed_cpus"] == [8, 9, 10, 11, 12, 13, 136, 137, 138, 139, 140, 141]


def test_cgroup_v2_unlimited_memory(machine_root):
    root = machine_root("milan-container-cpuset")
    (root / "sys/fs/cgroup/memory.max").write_text("max\n")
    facts = read_cpu_facts(str(root))
    assert facts["cgroup"]["memory_max_mib"] is None
    assert facts["memory_mib"] == 527958880 // 1024


def test_node_list_from_directories_when_online_missing(machine_root):
    root = machine_root("icx-2s-snc2")
    (root / "sys/devices/system/node/online").unlink()
    assert [n["id"] for n in read_cpu_facts(str(root))["numa_nodes"]] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("rel", "content", "message"),
    [
        ("proc/cpuinfo", None, "proc/cpuinfo: missing"),
        ("proc/meminfo", "MemFree: 1 kB\n", "proc/meminfo: cannot parse: no MemTotal line"),
        ("sys/devices/system/cpu/online", "0-x\n", "cpu/online: cannot parse: invalid cpulist"),
        ("sys/devices/system/cpu/cpu0/topology/core_id", "zero\n", "topology/core_id: cannot parse"),
        ("sys/devices/system/node/node1/cpulist", None, "node1/cpulist: missing"),
        ("sys/devices/system/node/node0/distance", "10 x\n", "node0/distance: cannot parse"),
        ("proc/self/status", "Cpus_allowed_list:\t1-0\n", "proc/self/status: cannot parse"),
    ],
)
def test_errors_name_the_file(machine_root, rel, content, message):
    root = machine_root("bdw-offline-cpus")
    path = root / rel
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    with pytest.raises(TopologyError, match=message) as info:
        read_cpu_facts(str(root))
    assert info.value.path == str(path)


def test_unreadable_file_is_reported(machine_root):
    root = machine_root("vm-2vcpu-nonuma")
    (root / "proc/meminfo").unlink()
    (root / "proc/meminfo").mkdir()
    with pytest.raises(TopologyError, match="proc/meminfo: cannot read"):
        read_cpu_facts(str(root))


def test_no_topology_at_all_is_an_error(machine_root):
    root = machine_root("vm-2vcpu-nonuma")
    for cpu in (0, 1):
        shutil.rmtree(root / f"sys/devices/system/cpu/cpu{cpu}/topology")
    with pytest.raises(TopologyError, match="no online CPU has a topology directory"):
        read_cpu_facts(str(root))


# ---------------------------------------------------------------- parsers


def test_parse_cpuinfo_blocks_and_alignment():
    blocks = parse_cpuinfo(ARM_CPUINFO + "\nprocessor\t: 1\nCPU part\t: 0xd0c\n")
    assert len(blocks) == 2
    assert blocks[0]["CPU architecture"] == "8"
    assert blocks[1] == {"processor": "1", "CPU part": "0xd0c"}


@pytest.mark.parametrize(
    ("text", "arch"),
    [
        (ARM_CPUINFO, "aarch64"),
        (S390X_CPUINFO, "s390x"),
        (PPC64LE_CPUINFO, "ppc64le"),
        ("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2\n", "x86_64"),
        ("processor\t: 0\n", None),
        ("", None),
    ],
)
def test_detect_arch(text, arch):
    assert detect_arch(parse_cpuinfo(text)) == arch


@pytest.mark.parametrize(
    ("text", "arch", "vendor", "model"),
    [
        (ARM_CPUINFO, "aarch64", "ARM", "Neoverse-N1"),
        (ARM_CPUINFO.replace("0xd0c", "0xd4f"), "aarch64", "ARM", "Neoverse-V2"),
        (ARM_CPUINFO.replace("0xd0c", "0xd05"), "aarch64", "ARM", "ARM part 0xd05"),
        (ARM_CPUINFO.replace("0x41", "0x48").replace("0xd0c", "0xd01"), "aarch64", "HiSilicon", "HiSilicon part 0xd01"),
        (S390X_CPUINFO, "s390x", "IBM", "8561"),
        (S390X_CPUINFO + "\ncpu number      : 2\nmachine         : 3931\n", "s390x", "IBM", "3931"),
        (PPC64LE_CPUINFO, "ppc64le", "IBM", "POWER9"),
    ],
)
def test_identify_cpu(text, arch, vendor, model):
    assert identify_cpu(parse_cpuinfo(text), arch) == (vendor, model)


def test_parse_isa_s390x_and_arm():
    s390 = parse_isa(parse_cpuinfo(S390X_CPUINFO), "s390x")
    assert [k for k in ISA_KEYS if s390[k]] == ["vxe"]
    arm = parse_isa(parse_cpuinfo(ARM_CPUINFO), "aarch64")
    assert [k for k in ISA_KEYS if arm[k]] == ["asimd"]
    assert isa_class("aarch64", arm) == "aarch64-neon"
    assert isa_class("s390x", s390) == "s390x-vxe"
    assert isa_class("ppc64le", parse_isa(parse_cpuinfo(PPC64LE_CPUINFO), "ppc64le")) == "ppc64le"


def test_s390x_without_vxe_is_not_classed_vxe_and_a_missing_features_line_is_refused(machine_root):
    z13 = S390X_CPUINFO.replace(" vxe gs vxe2 vxp", "").replace("machine = 8561", "machine = 2964")
    assert isa_class("s390x", parse_isa(parse_cpuinfo(z13), "s390x")) == "s390x"
    root = machine_root("vm-2vcpu-nonuma")
    (root / "proc/cpuinfo").write_text(S390X_CPUINFO)
    assert read_cpu_facts(str(root))["isa_class"] == "s390x-vxe"
    without_features = "".join(line for line in S390X_CPUINFO.splitlines(True) if "features" not in line)
    (root / "proc/cpuinfo").write_text(without_features)
    with pytest.raises(TopologyError, match="no features line on s390x"):
        read_cpu_facts(str(root))


def test_parse_isa_requires_flag_on_every_cpu():
    isa = parse_isa(_blocks_with_flags("avx2 avx512f", "avx2"), "x86_64")
    assert (isa["avx2"], isa["avx512f"]) == (True, False)


def test_parse_isa_ignores_other_arch_flags():
    # An x86 flags line naming an ARM feature must not set the ARM key.
    assert parse_isa(_blocks_with_flags("avx2 sve bf16"), "x86_64")["sve"] is False


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8", "x86_64-amx"),
        ("avx2 avx512f avx512_vnni avx512_bf16 amx_tile", "x86_64-avx512bf16"),
        ("avx2 avx512f avx512_vnni avx512_bf16", "x86_64-avx512bf16"),
        ("avx2 avx512f avx512_vnni", "x86_64-avx512vnni"),
        ("avx2 avx512f avx512_bf16", "x86_64-avx512"),
        ("avx2 avx512f", "x86_64-avx512"),
        ("avx2 avx_vnni", "x86_64-avx2"),
    ],
)
def test_isa_class_x86(flags, expected):
    assert isa_class("x86_64", parse_isa(_blocks_with_flags(flags), "x86_64")) == expected


def test_parse_meminfo_kib():
    assert parse_meminfo_kib("MemTotal:       24684084 kB\nMemFree: 1 kB\n") == 24684084
    assert parse_meminfo_kib("Node 3 MemTotal:       5597388 kB\n") == 5597388
    assert parse_meminfo_kib("Node 0 MemFree: 5 kB\nNode 0 MemTotal: 0 kB\n") == 0
    with pytest.raises(ValueError):
        parse_meminfo_kib("MemTotal: lots kB\n")


def test_parse_status_cpus():
    assert parse_status_cpus("Cpus_allowed:\t3\nCpus_allowed_list:\t0-1\n") == [0, 1]
    assert parse_status_cpus("Name:\tpython3\n") is None


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("max\n", None),
        ("9223372036854771712\n", None),
        ("9223372036854710272\n", None),
        ("34359738368\n", 32768),
        ("1048576\n", 1),
    ],
)
def test_parse_memory_limit(text, mib):
    assert parse_memory_limit(text) == mib


def test_parse_memory_limit_rejects_garbage():
    with pytest.raises(ValueError, match="not a byte count"):
        parse_memory_limit("-1\n")
    # Under 1 MiB (0 included) is no memory at all, never "unlimited".
    for text in ("0\n", "1048575\n"):
        with pytest.raises(ValueError, match="leaves no memory"):
            parse_memory_limit(text)


def test_parse_distance():
    assert parse_distance("10 21\n") == [10, 21]
    with pytest.raises(ValueError, match="not a list of integers"):
        parse_distance("10 far\n")


def test_group_cores_uses_package_and_core_id():
    # No sibling lists: core_id 0 exists in both packages and must not merge them.
    topology = {0: (0, 0, None), 1: (1, 0, None), 2: (0, 0, None), 3: (1, 0, None)}
    assert group_cores(topology) == [[0, 2], [1, 3]]


def test_group_cores_needs_siblings_to_agree():
    # Same ids but the kernel says the CPUs are not siblings: keep them apart.
    assert group_cores({0: (0, 0, [0]), 1: (0, 0, [1])}) == [[0], [1]]
    # core_id unknown: the sibling list alone decides; offline siblings ignored.
    assert group_cores({0: (0, None, [0, 2, 9]), 2: (0, None, [0, 2, 9]), 1: (0, None, [1])}) == [[0, 2], [1]]
    assert group_cores({4: (None, None, None), 5: (None, None, None)}) == [[4], [5]]


# Line ends of every kind, bad UTF-8 (also cut short at the end), a BOM, multi-byte characters.
TEXT_MODE_SAMPLES = [
    b"",
    b"0-3\n",
    b"0-3\r\n4\r5\n\r",
    b"\xff\xfe0-1\n",
    b"\xef\xbb\xbf0-1\n",
    "\u0663\uff13 \U0001f600\n".encode(),
    "ab\u00e9".encode()[:-1],
    b"x" * 70000 + b"\r",
]


@pytest.mark.parametrize("data", TEXT_MODE_SAMPLES)
def test_read_text_reads_what_text_mode_reads(tmp_path, data):
    path = tmp_path / "file"
    path.write_bytes(data)
    with open(path, encoding="utf-8", errors="replace") as handle:
        expected = handle.read()
    assert read_text(path, len(expected) + 1) == expected
    assert read_text(path, 2) == expected[:2]


def test_read_text_fails_as_open_does(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "missing", 10)
    with pytest.raises(IsADirectoryError):
        read_text(tmp_path, 10)


@pytest.mark.parametrize("chars, refused", [(8, False), (9, True)])
def test_a_file_over_the_size_limit_is_refused(tmp_path, monkeypatch, chars, refused):
    monkeypatch.setattr(vllm_cpu_topology, "MAX_FILE_CHARS", 8)
    (tmp_path / "online").write_text("0" * (chars - 1) + "\n")
    reader = vllm_cpu_topology._Reader(str(tmp_path))
    if refused:
        with pytest.raises(TopologyError, match="larger than"):
            reader.text("online")
    else:
        assert reader.text("online") == "0" * (chars - 1) + "\n"
