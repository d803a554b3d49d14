"""The contract: every parser on every sample of the real-output corpus (`tests/fixtures/real/<tool>/`), each
copied from the real tool's output with its source in that folder's SOURCES.md, against the verdict a
correct checker reaches (expected.json). A sample is never written by hand; a parser that disagrees with
the corpus is wrong, not the corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from railyard.backends.ssh.checks import parse_all_reduce_perf, parse_dcgmi_diag, parse_nvidia_smi, parse_xid
from railyard.domain.config.ssh import FATAL_XIDS

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
CORPUS_FATAL = (48, 63, 64, 74, 79, 92, 94, 95, 119, 120)  # the set expected.json is judged by (FATAL_XIDS adds 61, 62)


def cases(tool: str) -> list[tuple[str, dict]]:
    expected = json.loads((REAL / tool / "expected.json").read_text())
    files = {p.name for p in (REAL / tool).iterdir() if p.name not in ("SOURCES.md", "expected.json")}
    assert files == set(expected), f"{tool}: samples and expected.json disagree: {sorted(files ^ set(expected))}"
    sources = (REAL / tool / "SOURCES.md").read_text()
    assert all(name in sources for name in files), f"{tool}: a sample without its source in SOURCES.md"
    return sorted(expected.items())


def text(tool: str, name: str) -> str:
    return (REAL / tool / name).read_text(errors="replace")


def test_the_corpus_has_enough_samples_per_tool():
    for tool in ("xid", "dcgm", "nccl", "nvidia-smi"):
        assert len(cases(tool)) >= 8, tool


@pytest.mark.parametrize("name, want", cases("xid"))
def test_xid_on_real_kernel_logs(name: str, want: dict):
    v = parse_xid(text("xid", name), 0, fatal=CORPUS_FATAL)
    assert [x["xid"] for x in v.evidence["xids"]] == want["xids"], (name, v.evidence["xids"])
    if len(want["pci"]) == len(want["xids"]):  # (a user redacted the address in one sample)
        assert [x["pci"].split()[0] for x in v.evidence["xids"]] == want["pci"], name
    if want["fatal"]:  # Railyard's default set fails it too
        assert not parse_xid(text("xid", name), 0, fatal=FATAL_XIDS).passed, name
    if want["fatal"]:
        assert not v.passed and v.summary.startswith("XID "), (name, v.summary)
    else:  # no fatal XID: passes when it read a kernel log, fails closed when it could not tell
        assert v.passed or v.summary.startswith("kernel log not readable"), (name, v.summary)


def test_a_fatal_xid_on_a_mig_gpu_fails_and_names_its_instance():
    v = parse_xid(text("xid", "15-mig-gpu-i-xid94-95-driver-source-example.log"), 0, fatal=FATAL_XIDS)
    assert not v.passed and "GPU-I:" in v.summary, v.summary


@pytest.mark.parametrize("name, want", cases("nccl"))
def test_all_reduce_perf_on_real_runs(name: str, want: dict):
    v = parse_all_reduce_perf(text("nccl", name), 0, floor_gbps=300)
    assert v.passed is want["passed_at_300"], (name, v.summary)
    if want["busbw_gbps_at_largest"] is not None and "busbw_gbps" in v.evidence:
        assert v.evidence["size_bytes"] == want["largest_size_bytes"], (name, v.evidence)
        assert v.evidence["busbw_gbps"] >= want["busbw_gbps_at_largest"], (name, v.evidence)


def test_rows_an_mpi_launcher_tags_are_read():
    """Open MPI's --tag-output (`[1,0]<stdout>:`) and srun -l (` 0: `): every row was dropped before."""
    v = parse_all_reduce_perf(text("nccl", "03-openmpi-tag-output-16xa100-efa.txt"), 0, floor_gbps=40)
    assert v.passed and v.evidence["size_bytes"] == 4294967296 and v.evidence["busbw_gbps"] == 43.81, v.summary
    v = parse_all_reduce_perf(text("nccl", "04-srun-l-prefix-2node-16xh100-na.txt"), 0, floor_gbps=150)
    assert v.evidence.get("busbw_gbps") == 155.57, v.summary


def test_a_wrong_count_in_exponent_form_is_read_and_fails():
    v = parse_all_reduce_perf(text("nccl", "05-wrong-exponent-oob-failed-2xrtx3090.txt"), 0, floor_gbps=1)
    assert not v.passed and ("wrong results" in v.summary or "out-of-bounds" in v.summary), v.summary
    assert v.evidence.get("rows", 0) > 0, v.evidence  # the rows were read, exponents and all


# Railyard queries `nvidia-smi --query-gpu=... --format=csv,noheader`; the plain table and `-q` are in the corpus
# for what the tool prints on those hosts, and are read by no parser of Railyard's.
NOT_PARSED = ("table", "q")


def test_the_nvidia_smi_samples_railyard_does_not_parse_are_only_tables_and_q():
    others = [n for n, w in cases("nvidia-smi") if w["format"] in NOT_PARSED]
    assert others and all(n.split("-")[1] in ("table", "q") for n in others), others


@pytest.mark.parametrize("name, want", [c for c in cases("nvidia-smi") if c[1]["format"] not in NOT_PARSED])
def test_nvidia_smi_on_real_output(name: str, want: dict):
    v = parse_nvidia_smi(text("nvidia-smi", name), 0, expected_gpus=8, expected_driver=None, expect_ecc=True)
    assert v.passed is want["passed_8gpu_ecc_on"], (name, v.summary)


@pytest.mark.parametrize("name, want", cases("dcgm"))
def test_dcgmi_diag_on_real_reports(name: str, want: dict):
    level = want["level"] or 2
    v = parse_dcgmi_diag(text("dcgm", name), 0, level=level, expected_gpus=want["gpus_in_report"] or 8)
    assert v.passed is want["passed"], (name, v.summary)


def test_a_gpu_skipped_in_a_real_report_is_a_gpu_not_tested():
    v = parse_dcgmi_diag(text("dcgm", "02-dcgm-testing-per-gpu-v1.7-skip-gpu0-fail.json"), 0, level=3, expected_gpus=4)
    assert not v.passed
    # without the failing sm_stress, GPU 0's skipped memory test still fails the host
    doc = json.loads(text("dcgm", "02-dcgm-testing-per-gpu-v1.7-skip-gpu0-fail.json"))
    cats = doc["DCGM GPU Diagnostic"]["test_categories"]
    for c in cats:
        c["tests"] = [t for t in c["tests"] if t["name"] in ("Denylist", "memory", "pcie")]
    v = parse_dcgmi_diag(json.dumps(doc), 0, level=3, expected_gpus=4)
    assert not v.passed and "memory: skip on GPU 0" in v.summary, v.summary
    v = parse_dcgmi_diag(json.dumps(doc), 0, level=3, expected_gpus=4, may_skip={"memory": "known on this SKU"})
    assert v.passed and "allowed: known on this SKU" in v.summary, v.summary


def test_a_level_three_skip_of_the_eud_test_fails_unless_the_config_allows_it():
    name = "11-virtualclient-dcgm3-r3-1gpu-eud-skip.json"
    v = parse_dcgmi_diag(text("dcgm", name), 0, level=3, expected_gpus=1)
    assert not v.passed and "EUD Test: skip on GPU 0" in v.summary, v.summary
    v = parse_dcgmi_diag(text("dcgm", name), 0, level=3, expected_gpus=1, may_skip={"EUD Test": "no EUD package"})
    assert v.passed and "allowed: no EUD package" in v.summary, v.summary
    # a healthy 1-GPU report judged for an 8-GPU SKU: seven GPUs were never tested
    v = parse_dcgmi_diag(text("dcgm", "10-virtualclient-dcgm3-r2-1gpu-pass.json"), 0, level=2, expected_gpus=8)
    assert not v.passed and "lists 1 of 8 GPUs" in v.summary, v.summary


def test_a_level_one_report_names_no_gpu_and_is_judged_by_its_checks():
    v = parse_dcgmi_diag(text("dcgm", "09-virtualclient-dcgm3-r1-1gpu-pass.json"), 0, level=1, expected_gpus=8)
    assert v.passed and v.evidence["software_checks"] == 9, v.summary
    # ... but a level-1 report that names GPUs must name them all
    v = parse_dcgmi_diag(text("dcgm", "06-gb10-dcgm4.2.3-r1-software-fail.json"), 0, level=1, expected_gpus=8)
    assert not v.passed


def test_a_gpu_listed_twice_is_one_gpu():
    """The padded 8-row capture: its five columns of Railyard's query, ECC mode left out by the tool's caller."""
    lines = text("nvidia-smi", "13-csv-8xh100-padded-duplicate-bus-ids.csv").splitlines()
    head = [h.strip() for h in lines[0].split(",")]
    cols = [head.index(f) for f in ("index", "name", "pci.bus_id", "driver_version",
                                    "ecc.errors.uncorrected.volatile.total")]
    rows = [", ".join([[c.strip() for c in ln.split(",")][i] for i in cols]) for ln in lines[1:]]
    v = parse_nvidia_smi("\n".join(rows), 0, expected_gpus=8, expected_driver=None, expect_ecc=False)
    assert not v.passed  # 5 columns of 6: an unexpected line; with the ECC mode column a tool prints:
    v = parse_nvidia_smi("\n".join(r + ", Enabled" for r in rows), 0, expected_gpus=8, expected_driver="535.161.07")
    assert (not v.passed
            and "PCI bus id 00000000:0A:00.0, 00000000:11:00.0 listed more than once" in v.summary), v.summary
    assert "(4 distinct GPUs in 8 rows)" in v.summary
