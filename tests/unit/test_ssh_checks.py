"""Health-check parsers on the real tools' output formats, and recipe templates."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from railyard.recipes import render, template_fields
from railyard.ssh.checks import (
    check_versions,
    parse_all_reduce_perf,
    parse_dcgmi_diag,
    parse_nvidia_smi,
    parse_xid,
)
from railyard.ssh.spec import FATAL_XIDS

STANDINS = Path(__file__).resolve().parents[1] / "support" / "standins"


def standin(tool: str, profile: str, tmp_path: Path, *args: str) -> tuple[str, int]:
    """The stand-in's output for a profile: the same text the SSH tests parse from the hosts."""
    (tmp_path / "versions").mkdir(exist_ok=True)
    (tmp_path / "profile").write_text(profile)
    (tmp_path / "versions" / "gpu-driver").write_text("570.86.15\n")
    r = subprocess.run([str(STANDINS / tool), *args], capture_output=True, text=True,
                       env={"RAILYARD_HOST_STATE": str(tmp_path), "PATH": "/usr/bin:/bin"})
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


def test_nvidia_smi_real_failure_text():
    text = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n")
    v = parse_nvidia_smi(text, 9, expected_gpus=8, expected_driver=None)
    assert not v.passed and "exit 9" in v.summary
    v = parse_nvidia_smi("0, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 570.86.15, [N/A]\n", 0,
                         expected_gpus=1, expected_driver="570.86.15")
    assert v.passed


def test_dcgmi_diag(tmp_path):
    out, rc = standin("dcgmi", "healthy", tmp_path, "diag", "-r", "2", "-j")
    v = parse_dcgmi_diag(out, rc, level=2)
    assert v.passed and v.evidence["tests"] == 11
    out, rc = standin("dcgmi", "dcgm_pcie", tmp_path, "diag", "-r", "2", "-j")
    v = parse_dcgmi_diag(out, rc, level=2)
    assert not v.passed
    assert v.summary == "dcgmi diag -r 2: PCIe on GPU 5: Found 667 PCIe replays on GPU 5 (threshold 250)"
    assert not parse_dcgmi_diag("Error: unable to establish a connection to the specified host: localhost", 255, level=3).passed
    old = '{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "Diagnostic", "results": [{"gpu_ids": "2", "status": "Fail", "warnings": "GPU 2 failed the SM stress test"}]}]}]}}'
    v = parse_dcgmi_diag(old, 0, level=3)
    assert not v.passed and "GPU 2 failed the SM stress test" in v.summary


def test_all_reduce_perf_floor(tmp_path):
    out, rc = standin("all_reduce_perf", "healthy", tmp_path)
    v = parse_all_reduce_perf(out, rc, floor_gbps=300)
    assert v.passed and v.evidence["busbw_gbps"] == 366.45 and v.evidence["size_bytes"] == 8589934592
    out, rc = standin("all_reduce_perf", "slow_nvlink", tmp_path)
    v = parse_all_reduce_perf(out, rc, floor_gbps=300)
    assert not v.passed and "bus bandwidth 91.6 GB/s below floor 300.0 GB/s" in v.summary
    wrong = out.replace("91.60      0", "91.60      3", 1)
    assert "wrong results" in parse_all_reduce_perf(wrong, 0, floor_gbps=10).summary
    assert not parse_all_reduce_perf("Segmentation fault (core dumped)\n", 139, floor_gbps=10).passed


def test_xid(tmp_path):
    out, rc = standin("dmesg", "healthy", tmp_path)
    v = parse_xid(out, rc, fatal=FATAL_XIDS)
    assert v.passed and v.evidence["xids"][0]["xid"] == 31  # a non-fatal XID is evidence, not a failure
    out, rc = standin("dmesg", "xid79", tmp_path)
    v = parse_xid(out, rc, fatal=FATAL_XIDS)
    assert not v.passed and v.summary.startswith("XID 79 on PCI:0000:5a:00: pid=0, name=swapper/0, GPU has fallen off the bus.")


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
