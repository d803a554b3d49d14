"""Health-check parsers on the real tools' output formats, and recipe templates."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from railyard.backends.ssh.checks import (
    check_command,
    check_versions,
    parse_all_reduce_perf,
    parse_dcgmi_diag,
    parse_nvidia_smi,
    parse_xid,
)
from railyard.domain.config.ssh import FATAL_XIDS, HealthChecksSpec
from railyard.domain.recipes import render, template_fields

STANDINS = Path(__file__).resolve().parents[1] / "support" / "standins"


CHECK_OF = {"nvidia-smi": "gpu_inventory", "dcgmi": "dcgm", "all_reduce_perf": "nccl", "dmesg": "xid"}


def standin(tool: str, profile: str, tmp_path: Path) -> tuple[str, int]:
    """The stand-in's answer to the command Railyard runs, for a profile: what the SSH tests parse from the hosts
    (the stand-ins print samples of tests/fixtures/real/, chosen by profile)."""
    (tmp_path / "versions").mkdir(exist_ok=True)
    (tmp_path / "profile").write_text(profile)
    (tmp_path / "versions" / "gpu-driver").write_text("570.86.15\n")
    r = subprocess.run(["sh", "-c", check_command(CHECK_OF[tool], HealthChecksSpec(), 8)], capture_output=True,
                       text=True, env={"RAILYARD_HOST_STATE": str(tmp_path), "PATH": f"{STANDINS}:/usr/bin:/bin"})
    return r.stdout, r.returncode


def test_nvidia_smi_healthy_and_faulty(tmp_path):
    out, rc = standin("nvidia-smi", "healthy", tmp_path)
    v = parse_nvidia_smi(out, rc, expected_gpus=8, expected_driver="570.86.15")
    assert v.passed and len(v.evidence["gpus"]) == 8
    out, rc = standin("nvidia-smi", "ecc", tmp_path)
    v = parse_nvidia_smi(out, rc, expected_gpus=8, expected_driver="570.86.15")
    assert not v.passed and "GPU 3 has 12 uncorrected ECC errors" in v.summary
    out, rc = standin("nvidia-smi", "missing_gpu", tmp_path)
    v = parse_nvidia_smi(out, rc, expected_gpus=8, expected_driver="570.86.15")
    assert not v.passed and "7 of 8 GPUs visible" in v.summary
    v = parse_nvidia_smi(out, rc, expected_gpus=7, expected_driver="550.127.08")
    assert not v.passed and "driver 570.86.15 (expected 550.127.08)" in v.summary
    out, rc = standin("nvidia-smi", "ecc_off", tmp_path)  # a real report's GPUs with ECC disabled
    v = parse_nvidia_smi(out, rc, expected_gpus=8, expected_driver="570.86.15")
    assert not v.passed and "GPU 0 ECC mode Disabled (the SKU expects ECC on)" in v.summary


def test_nvidia_smi_real_failure_text():
    text = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n")
    v = parse_nvidia_smi(text, 9, expected_gpus=8, expected_driver=None)
    assert not v.passed and "exit 9" in v.summary
    # ECC off: nvidia-smi prints [N/A] for the count, which saw nothing; a SKU that expects ECC on fails it
    off = "0, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 570.86.15, [N/A], Disabled\n"
    v = parse_nvidia_smi(off, 0, expected_gpus=1, expected_driver="570.86.15")
    assert not v.passed and "GPU 0 ECC mode Disabled (the SKU expects ECC on)" in v.summary
    v = parse_nvidia_smi(off, 0, expected_gpus=1, expected_driver="570.86.15", expect_ecc=False)
    assert v.passed  # a SKU configured with ecc_required: false
    v = parse_nvidia_smi("0, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 570.86.15, [N/A], Enabled\n", 0,
                         expected_gpus=1, expected_driver="570.86.15")
    assert not v.passed and "uncorrected ECC count not reported ([N/A])" in v.summary


def test_dcgmi_diag(tmp_path):
    out, rc = standin("dcgmi", "healthy", tmp_path)
    v = parse_dcgmi_diag(out, rc, level=2, expected_gpus=8)
    assert v.passed and v.evidence["tests"] == 2 and v.evidence["software_checks"] == 9
    assert not parse_dcgmi_diag(out, rc, level=2, expected_gpus=9).passed  # a GPU missing from the report
    out, rc = standin("dcgmi", "dcgm_fail", tmp_path)
    v = parse_dcgmi_diag(out, rc, level=2)
    assert not v.passed
    assert rc == 226 and v.summary.startswith("dcgmi diag -r 2: sm_stress on GPU 0: Max stress level of 2128.7 did "
                                              "not exceed desired stress level of 3000.0 for GPU 0 | ")
    assert not parse_dcgmi_diag("Error: unable to establish a connection to the specified host: localhost", 255,
                                level=3).passed
    old = ('{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "Diagnostic", '
           '"results": [{"gpu_ids": "2", "status": "Fail", "warnings": "GPU 2 failed the SM stress test"}]}]}]}}')
    v = parse_dcgmi_diag(old, 0, level=3)
    assert not v.passed and "GPU 2 failed the SM stress test" in v.summary


def test_all_reduce_perf_floor(tmp_path):
    out, rc = standin("all_reduce_perf", "healthy", tmp_path)
    v = parse_all_reduce_perf(out, rc, floor_gbps=300)
    assert v.passed and v.evidence["busbw_gbps"] == 476.53 and v.evidence["size_bytes"] == 4294967296
    out, rc = standin("all_reduce_perf", "slow_nvlink", tmp_path)
    v = parse_all_reduce_perf(out, rc, floor_gbps=300)
    assert not v.passed and "bus bandwidth 235.3 GB/s below floor 300.0 GB/s" in v.summary
    wrong = out.replace("235.26    N/A", "235.26      3", 1)
    assert "wrong results" in parse_all_reduce_perf(wrong, 0, floor_gbps=10).summary
    assert not parse_all_reduce_perf("Segmentation fault (core dumped)\n", 139, floor_gbps=10).passed


def test_xid(tmp_path):
    out, rc = standin("dmesg", "healthy", tmp_path)
    v = parse_xid(out, rc, fatal=FATAL_XIDS)
    assert v.passed and [x["xid"] for x in v.evidence["xids"]] == [43, 43, 31]  # non-fatal XIDs: evidence only
    out, rc = standin("dmesg", "xid79", tmp_path)
    v = parse_xid(out, rc, fatal=FATAL_XIDS)
    assert not v.passed and v.summary.startswith("XID 79 on PCI:0000:a1:00: pid='<unknown>', name=<unknown>, "
                                                 "GPU has fallen off the bus.")


def test_versions_verdict():
    assert check_versions({"a": "1"}, {"a": "1"}).passed
    v = check_versions({"a": "0"}, {"a": "1", "b": "2"})
    assert not v.passed and v.summary == "versions: a 0 (expected 1), b unknown (expected 2)"


def test_recipe_templates_quote_checked_tokens():
    assert template_fields("apt-get install -y nvidia-driver={version} --host {host}") == ["version", "host"]
    assert render("install {component}={version}", component="gpu-driver", version="570.86.15") == \
        "install gpu-driver=570.86.15"
    for bad in ("1.2;rm -rf /", "../x", "$(id)", "`id`", "-o", "a b", "x\ny", "a" * 300):
        with pytest.raises(ValueError, match="not a plain token"):
            render("install {version}", version=bad)
    for tmpl, msg in (("x {user}", "unknown template variable"), ("x {version!r}", "format spec or conversion"),
                      ("x {version:>10}", "format spec or conversion"), ("x {0}", "unknown template variable"),
                      ("x {version.__class__}", "unknown template variable"), ("a\nb", "control characters"),
                      ("x {", "not a valid template")):
        with pytest.raises(ValueError, match=msg):
            template_fields(tmpl)


# ---- fail closed: a check that could not see fails, with what it saw ----------------------------
DMESG_EPERM = "dmesg: read kernel buffer failed: Operation not permitted\n"
JOURNAL_HINT = ("Hint: You are currently not seeing messages from other users and the system.\n"
                "      Users in groups 'adm', 'systemd-journal' can see all messages.\n"
                "      Pass -q to turn off this notice.\n")


@pytest.mark.parametrize("text, rc", [
    (DMESG_EPERM, 1),                                                   # dmesg_restrict, no journalctl fallback
    (DMESG_EPERM + "sh: 1: journalctl: not found\n", 127),
    (DMESG_EPERM + JOURNAL_HINT, 0),                                    # journalctl as a user outside adm
    (DMESG_EPERM + "No journal files were found.\n-- No entries --\n", 0),
    ("-- No entries --\n", 0),
    ("", 0),                                                            # journalctl -q, nothing visible
    ("   \n", 0),
    ("Welcome to gpu-a01!\nlast login: never\n", 0),                    # text, but no kernel log line
])
def test_xid_unreadable_kernel_log_fails(text, rc):
    v = parse_xid(text, rc, fatal=FATAL_XIDS)
    assert not v.passed and v.summary.startswith(f"kernel log not readable (exit {rc}): ")
    assert v.evidence["kernel_lines"] == 0
    if text.strip():
        assert repr(text.strip()[:160]) in v.summary
    else:
        assert v.summary.endswith("no output")


def test_xid_journalctl_and_dmesg_shapes():
    journal = ("Jan 06 10:00:00 gpu-a01 kernel: Linux version 6.1.0-25-amd64 (debian-kernel@lists.debian.org)\n"
               "Jan 06 10:15:12 gpu-a01 kernel: NVRM: Xid (PCI:0000:3a:00): 31, pid=18822, name=python3, Ch 00000008\n")
    v = parse_xid(DMESG_EPERM + journal, 0, fatal=FATAL_XIDS)  # dmesg refused, journalctl read it
    assert v.passed and v.evidence["kernel_lines"] == 2 and v.evidence["xids"][0]["xid"] == 31
    fatal = journal + ("Jan 06 11:02:40 gpu-a01 kernel: NVRM: Xid (PCI:0000:5a:00): 79, pid=0, name=swapper/0, "
                       "GPU has fallen off the bus.\n")
    v = parse_xid(fatal, 0, fatal=FATAL_XIDS)
    assert not v.passed and v.summary.startswith("XID 79 on PCI:0000:5a:00")
    for line in ("[    0.000000] Linux version 6.1.0-25-amd64", "<6>[    0.000000] Linux version 6.1.0-25-amd64",
                 "kern  :info  : [    0.000000] Linux version 6.1.0-25-amd64",
                 "[Mon Jan  6 10:00:00 2025] Linux version 6.1.0-25-amd64",
                 "2025-01-06T10:00:00+0000 gpu-a01 kernel: Linux version 6.1.0-25-amd64",
                 "[    0.000000] gpu-a01 kernel: Linux version 6.1.0-25-amd64"):
        assert parse_xid(line + "\n", 0, fatal=FATAL_XIDS).passed, line


def test_xid_partial_read_fails(tmp_path):
    out, _ = standin("dmesg", "healthy", tmp_path)
    v = parse_xid(out, 124, fatal=FATAL_XIDS)  # killed by the timeout part-way: the rest was not seen
    assert not v.passed and v.summary.startswith("kernel log read failed (exit 124) after 8 line(s)")


def test_xid_command_prefers_dmesg(tmp_path):
    """The fixed command, run by sh on stand-ins: dmesg first, journalctl only when dmesg fails, C locale."""
    cmd = check_command("xid", HealthChecksSpec(), 8)
    assert cmd.index("dmesg") < cmd.index("journalctl") and "journalctl -k" in cmd and "--no-pager" in cmd
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    eperm = f"echo '{DMESG_EPERM.strip()}' >&2; exit 1"
    journal_ok = "printf 'Jan 06 10:00:00 gpu-a01 kernel: Linux version 6.1.0-25-amd64\\n'"
    journal_bad = "echo 'No journal files were found.' >&2; exit 1"
    for dmesg, journalctl, want_rc, want_journal, passes in (
            ("echo \"[    0.000000] Linux version 6.1.0-25-amd64 LC_ALL=$LC_ALL\"", journal_ok, 0, False, True),
            (eperm, journal_ok, 0, True, True),
            (eperm, journal_bad, 1, True, False)):
        (bin_ / "dmesg").write_text(f"#!/bin/sh\n{dmesg}\n")
        (bin_ / "journalctl").write_text(f"#!/bin/sh\necho \"journalctl $*\" >&2\n{journalctl}\n")
        for f in bin_.iterdir():
            f.chmod(0o755)
        r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True,
                           env={"PATH": f"{bin_}:/usr/bin:/bin", "LANG": "de_DE.UTF-8"})
        text = r.stdout + r.stderr
        assert r.returncode == want_rc and ("journalctl -k" in text) == want_journal, text
        v = parse_xid(text, r.returncode, fatal=FATAL_XIDS)
        assert v.passed == passes, text
        if not want_journal:
            assert "LC_ALL=C" in text
        if not passes:  # what was seen: dmesg's refusal and journalctl's
            assert "Operation not permitted" in v.summary and "No journal files were found." in v.summary


def _dcgm4(tests: list[dict], categories: str = "Hardware") -> str:
    """DCGM 4.x `dcgmi diag -j`: "DCGM Diagnostic", entity results, test_summary, metadata."""
    return json.dumps({"DCGM Diagnostic": {"test_categories": [{"category": categories, "tests": tests}]},
                       "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1,
                                          "entities": [{"entity_id": i, "device_id": "2330", "serial_num": f"165322{i}"}
                                                       for i in range(8)]}],
                       "metadata": {"version": "4.2.3", "Driver Version Detected": "570.86.15"}}, indent=4)


def _dcgm4_test(name: str, statuses: list[str], warning: str | None = None) -> dict:
    results = [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": i, "status": s}
               for i, s in enumerate(statuses)]
    for r in results:
        if r["status"] == "Fail" and warning:
            r["warnings"] = [{"error_category": 2, "error_id": 45, "error_severity": 2, "warning": warning}]
    worst = "Fail" if "Fail" in statuses else "Pass" if "Pass" in statuses else statuses[0] if statuses else "Skip"
    return {"name": name, "results": results, "test_summary": {"status": worst}}


def test_dcgmi_diag_4x_layout():
    v = parse_dcgmi_diag(_dcgm4([_dcgm4_test("memory", ["Pass"] * 8), _dcgm4_test("diagnostic", ["Pass"] * 8)]), 0,
                         level=2)
    assert v.passed and v.evidence["tests"] == 2 and v.evidence["version"] == "4.2.3"
    bad = _dcgm4([_dcgm4_test("pcie", ["Pass"] * 5 + ["Fail", "Pass", "Pass"],
                              "Found 667 PCIe replays on GPU 5 (threshold 250)")],
                 "Integration")
    v = parse_dcgmi_diag(bad, 226, level=2)
    assert not v.passed and (
        v.summary == "dcgmi diag -r 2: pcie on GPU 5: Found 667 PCIe replays on GPU 5 (threshold 250)")
    # one GPU skipped, the others ran: that GPU was not tested, so the host fails, unless the test may skip
    report = _dcgm4([_dcgm4_test("memory", ["Skip"] + ["Pass"] * 7), _dcgm4_test("nvbandwidth", ["Skip"] * 8)])
    v = parse_dcgmi_diag(report, 0, level=2, expected_gpus=8)
    assert (not v.passed and "memory: skip on GPU 0" in v.summary
            and "nvbandwidth: skip on GPU 0,1,2,3,4,5,6,7" in v.summary)
    v = parse_dcgmi_diag(report, 0, level=2, expected_gpus=8,
                         may_skip={"memory": "GPU 0 is a spare", "nvbandwidth": "not on this SKU"})
    assert v.passed and "allowed: not on this SKU" in v.summary, v.summary
    # the test's own status failed though no result says why
    summary_only = json.loads(_dcgm4([_dcgm4_test("software", ["Pass"])], "Deployment"))
    summary_only["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["test_summary"] = {
        "status": "Fail", "warnings": [{"error_id": 29, "warning": "Persistence mode for GPU 0 is disabled."}]}
    v = parse_dcgmi_diag(json.dumps(summary_only), 0, level=1)
    assert not v.passed and v.summary == "dcgmi diag -r 1: software: Persistence mode for GPU 0 is disabled."


@pytest.mark.parametrize("report, needle", [
    ('{"DCGM GPU Diagnostic": {"test_categories": [], "version": "3.3.5"}}', "0 hardware tests in the report"),
    ('{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": []}], "version": "3.3.5"}}',
     "0 hardware tests in the report"),
    ('{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": '
     '[{"name": "GPU Memory", "results": []}]}]}}',
     "the report lists 0 of 8 GPUs"),
    ('{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "GPU Memory"}]}]}}',
     "the report lists 0 of 8 GPUs"),
    (_dcgm4([_dcgm4_test("memory", ["Skip"] * 8), _dcgm4_test("diagnostic", ["Not Run"] * 8)]),
     "tested nothing on some GPUs: memory: skip on GPU 0,1,2,3,4,5,6,7 | diagnostic: notrun on GPU 0,1,2,3,4,5,6,7"),
    (_dcgm4([_dcgm4_test("memory", [])]), "the report lists 0 of 8 GPUs"),
    # the software checks always run: on their own they never make a hardware diagnostic pass
    (_dcgm4([_dcgm4_test("software", ["Pass"] * 8)], "Deployment"), "0 hardware tests in the report (8 software check"),
])
def test_dcgmi_diag_that_tested_nothing_on_the_hardware_fails(report, needle):
    v = parse_dcgmi_diag(report, 0, level=2, expected_gpus=8)
    assert not v.passed and needle in v.summary, v.summary


def test_dcgmi_diag_runtime_error_and_garbage():
    text = '{"DCGM Diagnostic": {"runtime_error": "Error: unable to run the diagnostic: nv-hostengine is not running"}}'
    v = parse_dcgmi_diag(text, 0, level=2)
    assert not v.passed and "nv-hostengine is not running" in v.summary
    for garbage in ('{"DCGM GPU Diagnostic": {"test_categories": ["Hardware", 3, null, '
                    '{"tests": ["x", {"results": [1]}]}]}}',
                    '{"DCGM Diagnostic": []}', '{"something": "else"}'):
        assert not parse_dcgmi_diag(garbage, 0, level=2).passed


NCCL_HEAD = ("# nThread 1 nGpus 8 minBytes 1073741824 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20"
             " agg iters: 1 validation: {val} graph: 0\n"
             """#
# Using devices
#  Rank  0 Group  0 Pid  41873 on gpu-a01 device  0 [0x18] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
""")


def _nccl(rows: list[tuple[str, str, str]], val: int = 1, tail: str = "# Out of bounds values : 0 OK\n") -> str:
    """A table of (size, busbw, #wrong) rows, the other columns as all_reduce_perf prints them."""
    body = "".join(f"  {s:>10}  {int(s) // 4:>12}     float     sum      -1   5326.1  {b:>6}  {b:>6}  {w:>5}"
                   f"   5318.7  {b:>6}  {b:>6}  {w:>5}\n" for s, b, w in rows)
    return NCCL_HEAD.format(val=val) + body + tail + "# Avg bus bandwidth    : 0 \n#\n"


def test_all_reduce_perf_empty_results_fail():
    v = parse_all_reduce_perf(NCCL_HEAD.format(val=1), 0, floor_gbps=0)  # the header, then nothing
    assert not v.passed and v.summary.startswith("all_reduce_perf: no result rows (exit 0): '# nThread 1 nGpus 8")
    v = parse_all_reduce_perf("", 0, floor_gbps=0)
    assert not v.passed and v.summary == "all_reduce_perf: no result rows (exit 0): no output"
    zero = _nccl([("1073741824", "0.00", "N/A"), ("8589934592", "0.00", "N/A")], val=0)
    v = parse_all_reduce_perf(zero, 0, floor_gbps=0)  # no floor for the SKU: 0 GB/s still is not a result
    assert not v.passed and (
        v.summary == "all_reduce_perf: 2 result row(s), none with a bus bandwidth (busbw 0.00; exit 0)")
    na = _nccl([("1073741824", "N/A", "N/A"), ("8589934592", "N/A", "N/A")], val=0)
    v = parse_all_reduce_perf(na, 0, floor_gbps=0)
    assert not v.passed and (
        v.summary == "all_reduce_perf: 2 result row(s), none with a bus bandwidth (busbw N/A; exit 0)")
    zero_checked = _nccl([("1073741824", "0.00", "0"), ("8589934592", "0.00", "0")])
    assert not parse_all_reduce_perf(zero_checked, 0, floor_gbps=0).passed
    last_zero = _nccl([("1073741824", "352.84", "0"), ("8589934592", "0.00", "0")])
    v = parse_all_reduce_perf(last_zero, 0, floor_gbps=0)
    assert not v.passed and (
        v.summary == "all_reduce_perf: no bus bandwidth at the largest size 8589934592 B (busbw 0.00 / 0.00)")


def test_all_reduce_perf_unvalidated_and_out_of_bounds():
    unchecked = _nccl([("1073741824", "352.84", "N/A"), ("8589934592", "366.45", "N/A")], val=0, tail="")
    v = parse_all_reduce_perf(unchecked, 0, floor_gbps=300)  # no "# Out of bounds" line: fine
    assert v.passed and not v.evidence["validated"] and v.summary.endswith("(results not validated: #wrong N/A)")
    checked = _nccl([("1073741824", "352.84", "0"), ("8589934592", "366.45", "0")])
    v = parse_all_reduce_perf(checked, 0, floor_gbps=300)
    assert v.passed and v.evidence["validated"] and v.summary == "all_reduce_perf: bus bandwidth 366.4 GB/s"
    oob = checked.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 3 FAILED")
    v = parse_all_reduce_perf(oob, 0, floor_gbps=300)
    assert not v.passed and v.summary == "all_reduce_perf: 3 out-of-bounds values (FAILED)"


@pytest.mark.parametrize("text, rc, expected", [
    ("", 0, 8),
    ("\n", 0, 0),                 # a SKU configured with 0 GPUs still needs one seen
    ("No devices were found\n", 6, 8),
    ("No devices were found\n", 0, 8),
])
def test_nvidia_smi_zero_gpus_fails(text, rc, expected):
    v = parse_nvidia_smi(text, rc, expected_gpus=expected, expected_driver=None)
    assert not v.passed
    if rc == 0 and not text.strip():
        assert v.summary == "nvidia-smi: no GPUs listed (exit 0): no output"
