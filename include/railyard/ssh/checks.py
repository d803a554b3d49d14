"""Deep health checks: the command each runs on a host, and a parser for its tool's real output.

Parsers are pure functions from the tool's text (and exit status) to a `Verdict` with evidence,
so they are tested on captured output without any host. Output from a host is untrusted: a parser
never raises on garbage, it fails the check and says what it saw.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import Field

from railyard.models import Strict
from railyard.ssh.spec import HealthChecksSpec


class Verdict(Strict):
    check: str
    passed: bool
    summary: str
    evidence: dict[str, Any] = Field(default_factory=dict)


NVIDIA_SMI_FIELDS = ("index", "name", "pci.bus_id", "driver_version", "ecc.errors.uncorrected.volatile.total")


def check_command(name: str, spec: HealthChecksSpec, gpus: int) -> str:
    """The fixed command line of a catalog check: only integers from the config go into it."""
    if name == "gpu_inventory":
        return f"nvidia-smi --query-gpu={','.join(NVIDIA_SMI_FIELDS)} --format=csv,noheader"
    if name == "dcgm":
        return f"dcgmi diag -r {int(spec.dcgm_level)} -j"
    if name == "nccl":
        return f"all_reduce_perf -b 1G -e 8G -f 2 -g {int(gpus)}"
    if name == "xid":
        return "dmesg 2>/dev/null || journalctl -k -q --no-pager"
    raise ValueError(f"check {name!r} has no host command")


def _tail(text: str, n: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


# ---- nvidia-smi --query-gpu=... --format=csv,noheader -------------------------------------------
def parse_nvidia_smi(text: str, rc: int, *, expected_gpus: int, expected_driver: str | None) -> Verdict:
    name = "gpu_inventory"
    if rc != 0:
        return Verdict(check=name, passed=False, summary=f"nvidia-smi failed (exit {rc}): {_tail(text, 160)}",
                       evidence={"rc": rc, "output": _tail(text)})
    gpus: list[dict[str, Any]] = []
    problems: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(NVIDIA_SMI_FIELDS):
            return Verdict(check=name, passed=False, summary=f"nvidia-smi: unexpected line {line.strip()[:120]!r}",
                           evidence={"output": _tail(text)})
        idx, model, bus, driver, ecc = parts
        gpus.append({"index": idx, "name": model, "bus_id": bus, "driver": driver, "ecc_uncorrected": ecc})
        if ecc not in ("[N/A]", "N/A", "[Not Supported]"):
            try:
                n = int(ecc)
            except ValueError:
                problems.append(f"GPU {idx} ECC count unreadable ({ecc!r})")
            else:
                if n > 0:
                    problems.append(f"GPU {idx} has {n} uncorrected ECC errors")
        if expected_driver is not None and driver != expected_driver:
            problems.append(f"GPU {idx} driver {driver} (expected {expected_driver})")
    if len(gpus) != expected_gpus:
        problems.insert(0, f"{len(gpus)} of {expected_gpus} GPUs visible")
    ev = {"gpus": gpus, "expected_gpus": expected_gpus}
    if problems:
        return Verdict(check=name, passed=False, summary="nvidia-smi: " + "; ".join(problems[:4]), evidence=ev)
    return Verdict(check=name, passed=True, summary=f"nvidia-smi: {len(gpus)} GPUs, driver {gpus[0]['driver']}", evidence=ev)


# ---- dcgmi diag -r N -j -------------------------------------------------------------------------
def _warning_texts(result: dict[str, Any]) -> list[str]:
    out: list[str] = []
    w = result.get("warnings")
    if isinstance(w, str) and w.strip():
        out.append(w.strip())
    elif isinstance(w, list):
        for item in w:
            if isinstance(item, dict):
                text = item.get("warning") or item.get("message") or item.get("msg")
                if text:
                    out.append(str(text).strip())
            elif isinstance(item, str):
                out.append(item.strip())
    return out


def parse_dcgmi_diag(text: str, rc: int, *, level: int) -> Verdict:
    """`dcgmi diag -r N -j`: DCGM 3.x ("DCGM GPU Diagnostic") and 4.x ("DCGM Diagnostic") layouts."""
    name = "dcgm"
    start, end = text.find("{"), text.rfind("}")
    try:
        doc = json.loads(text[start:end + 1]) if start >= 0 else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return Verdict(check=name, passed=False, summary=f"dcgmi diag -r {level}: no JSON report (exit {rc}): {_tail(text, 160)}",
                       evidence={"rc": rc, "output": _tail(text)})
    body = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic") or {}
    cats = body.get("test_categories") if isinstance(body, dict) else None
    if not isinstance(cats, list):
        return Verdict(check=name, passed=False, summary=f"dcgmi diag -r {level}: report has no test_categories",
                       evidence={"rc": rc, "output": _tail(text)})
    failures: list[str] = []
    tests_run = 0
    for cat in cats:
        for test in (cat or {}).get("tests", []) or []:
            tests_run += 1
            for res in test.get("results", []) or []:
                status = str(res.get("status", "")).lower()
                if status in ("fail", "failed", "error"):
                    gpu = res.get("gpu_ids", res.get("entity_id", "?"))
                    why = "; ".join(_warning_texts(res)) or "failed"
                    failures.append(f"{test.get('name', '?')} on GPU {gpu}: {why}")
    ev = {"tests": tests_run, "failures": failures, "version": body.get("version") if isinstance(body, dict) else None}
    if failures:
        return Verdict(check=name, passed=False, summary=f"dcgmi diag -r {level}: " + " | ".join(failures[:3]), evidence=ev)
    if rc != 0:
        return Verdict(check=name, passed=False, summary=f"dcgmi diag -r {level}: exit {rc}", evidence=ev)
    return Verdict(check=name, passed=True, summary=f"dcgmi diag -r {level}: {tests_run} tests passed", evidence=ev)


# ---- all_reduce_perf (nccl-tests) --------------------------------------------------------------
_NCCL_ROW = re.compile(
    r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>\w+)\s+(?P<redop>\w+)\s+(?P<root>-?\d+)"
    r"\s+(?P<t1>[\d.]+)\s+(?P<alg1>[\d.]+)\s+(?P<bus1>[\d.]+)\s+(?P<wrong1>\S+)"
    r"\s+(?P<t2>[\d.]+)\s+(?P<alg2>[\d.]+)\s+(?P<bus2>[\d.]+)\s+(?P<wrong2>\S+)\s*$"
)
_NCCL_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<bw>[\d.]+)")


def parse_all_reduce_perf(text: str, rc: int, *, floor_gbps: float) -> Verdict:
    """Bus bandwidth at the largest message size (the NVLink/IB-bound figure) against the SKU floor."""
    name = "nccl"
    rows = []
    avg = None
    for line in text.splitlines():
        m = _NCCL_ROW.match(line)
        if m:
            rows.append(m)
            continue
        a = _NCCL_AVG.match(line.strip())
        if a:
            avg = float(a["bw"])
    if not rows:
        return Verdict(check=name, passed=False, summary=f"all_reduce_perf: no result rows (exit {rc}): {_tail(text, 160)}",
                       evidence={"rc": rc, "output": _tail(text)})
    last = max(rows, key=lambda m: int(m["size"]))
    busbw = max(float(last["bus1"]), float(last["bus2"]))
    wrong = [m["size"] for m in rows for w in (m["wrong1"], m["wrong2"]) if w not in ("0", "N/A")]
    ev = {"size_bytes": int(last["size"]), "busbw_gbps": busbw, "avg_busbw_gbps": avg, "floor_gbps": floor_gbps,
          "wrong_sizes": wrong}
    if wrong:
        return Verdict(check=name, passed=False, summary=f"all_reduce_perf: wrong results at sizes {', '.join(wrong[:3])}", evidence=ev)
    if rc != 0:
        return Verdict(check=name, passed=False, summary=f"all_reduce_perf: exit {rc}", evidence=ev)
    if busbw < floor_gbps:
        return Verdict(check=name, passed=False,
                       summary=f"all_reduce_perf: bus bandwidth {busbw:.1f} GB/s below floor {floor_gbps:.1f} GB/s "
                               f"at {int(last['size'])} B", evidence=ev)
    return Verdict(check=name, passed=True, summary=f"all_reduce_perf: bus bandwidth {busbw:.1f} GB/s", evidence=ev)


# ---- XID errors in the kernel log --------------------------------------------------------------
_XID_RE = re.compile(r"NVRM: Xid \((?P<pci>PCI:[0-9A-Fa-f:.]+)\): (?P<xid>\d+)(?:, (?P<detail>.*))?")


def parse_xid(text: str, rc: int, *, fatal: list[int] | tuple[int, ...]) -> Verdict:
    name = "xid"
    seen: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _XID_RE.search(line)
        if m:
            seen.append({"pci": m["pci"], "xid": int(m["xid"]), "detail": (m["detail"] or "").strip()[:160]})
    bad = [x for x in seen if x["xid"] in set(fatal)]
    ev = {"xids": seen[-20:], "fatal": sorted(set(fatal))}
    if bad:
        first = bad[0]
        return Verdict(check=name, passed=False,
                       summary=f"XID {first['xid']} on {first['pci']}: {first['detail'] or 'fatal XID'}"
                               + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""), evidence=ev)
    if rc != 0 and not text.strip():
        return Verdict(check=name, passed=False, summary=f"kernel log unreadable (exit {rc})", evidence=ev)
    return Verdict(check=name, passed=True, summary=f"kernel log: {len(seen)} XID line(s), none fatal", evidence=ev)


# ---- versions ------------------------------------------------------------------------------------
def check_versions(found: dict[str, str], expected: dict[str, str]) -> Verdict:
    wrong = {c: {"expected": v, "found": found.get(c)} for c, v in expected.items() if found.get(c) != v}
    if wrong:
        desc = ", ".join(f"{c} {w['found'] or 'unknown'} (expected {w['expected']})" for c, w in wrong.items())
        return Verdict(check="versions", passed=False, summary=f"versions: {desc}", evidence={"found": found, "wrong": wrong})
    return Verdict(check="versions", passed=True, summary="versions at target", evidence={"found": found})


def judge(name: str, text: str, rc: int, *, spec: HealthChecksSpec, sku: str, expected: dict[str, str]) -> Verdict:
    """One catalog check's verdict from its raw output."""
    if name == "gpu_inventory":
        drv = expected.get(spec.driver_component) if spec.driver_component else None
        return parse_nvidia_smi(text, rc, expected_gpus=spec.gpus(sku), expected_driver=drv)
    if name == "dcgm":
        return parse_dcgmi_diag(text, rc, level=spec.dcgm_level)
    if name == "nccl":
        return parse_all_reduce_perf(text, rc, floor_gbps=spec.nccl_min_busbw_gbps.get(sku, 0.0))
    if name == "xid":
        return parse_xid(text, rc, fatal=spec.fatal_xids)
    raise ValueError(f"unknown check {name!r}")
