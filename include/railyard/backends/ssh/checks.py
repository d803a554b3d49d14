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

from railyard.domain.config.ssh import HealthChecksSpec
from railyard.domain.models import Strict


class Verdict(Strict):
    check: str
    passed: bool
    summary: str
    evidence: dict[str, Any] = Field(default_factory=dict)


NVIDIA_SMI_FIELDS = ("index", "name", "pci.bus_id", "driver_version", "ecc.errors.uncorrected.volatile.total",
                     "ecc.mode.current")
_NOT_READ = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]")

# The kernel log: `dmesg` first; journalctl's kernel messages of this boot only if dmesg fails (not
# installed, or dmesg_restrict for a non-root user). The C locale keeps timestamps and messages in
# the shapes `parse_xid` reads; sbin is added for the non-login shells of ssh; dmesg's error stays in
# the output, so a host where neither could read the log says why.
XID_COMMAND = ('LC_ALL=C; export LC_ALL; PATH="$PATH:/usr/sbin:/sbin"; export PATH; '
               "dmesg || journalctl -k -q --no-pager -o short")


def check_command(name: str, spec: HealthChecksSpec, gpus: int) -> str:
    """The fixed command line of a catalog check: only integers from the config go into it."""
    if name == "gpu_inventory":
        return f"nvidia-smi --query-gpu={','.join(NVIDIA_SMI_FIELDS)} --format=csv,noheader"
    if name == "dcgm":
        return f"dcgmi diag -r {int(spec.dcgm_level)} -j"
    if name == "nccl":
        return f"all_reduce_perf -b 1G -e 8G -f 2 -g {int(gpus)}"
    if name == "xid":
        return XID_COMMAND
    raise ValueError(f"check {name!r} has no host command")


def _tail(text: str, n: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def _seen(text: str, n: int = 160) -> str:
    """The first `n` characters a check saw, quoted: what a verdict that could not see reports."""
    text = text.strip()
    return repr(text[:n]) + ("..." if len(text) > n else "") if text else "no output"


# ---- nvidia-smi --query-gpu=... --format=csv,noheader -------------------------------------------
def parse_nvidia_smi(text: str, rc: int, *, expected_gpus: int, expected_driver: str | None,
                     expect_ecc: bool = True) -> Verdict:
    """GPU count, driver, ECC. With `expect_ecc` (the SKU's `ecc_required`, on by default) a GPU whose ECC
    mode is not Enabled fails, and so does one whose uncorrected count is not reported (`[N/A]` is what
    nvidia-smi prints with ECC off: it saw nothing)."""
    name = "gpu_inventory"
    if rc != 0:
        return Verdict(check=name, passed=False, summary=f"nvidia-smi failed (exit {rc}): {_tail(text, 160)}",
                       evidence={"rc": rc, "output": _tail(text)})
    gpus: list[dict[str, Any]] = []
    problems: list[str] = []
    lines = [ln for ln in text.splitlines() if ln.strip()]
    cols = list(range(len(NVIDIA_SMI_FIELDS)))  # `--format=csv,noheader`: the query's own order
    if lines:  # `--format=csv` (a header naming each column, units in brackets): the columns by name
        header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in lines[0].split(",")]
        if set(NVIDIA_SMI_FIELDS) <= set(header):
            cols = [header.index(f) for f in NVIDIA_SMI_FIELDS]
            lines = lines[1:]
        elif {"index", "name", "driver_version"} & set(header) and len(header) > 1:
            missing = [f for f in NVIDIA_SMI_FIELDS if f not in header]
            return Verdict(check=name, passed=False,
                           summary=f"nvidia-smi: the report has no column {', '.join(missing)}",
                           evidence={"output": _tail(text)})
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < len(NVIDIA_SMI_FIELDS) or (cols == list(range(len(NVIDIA_SMI_FIELDS)))
                                                   and len(parts) != len(NVIDIA_SMI_FIELDS)):
            return Verdict(check=name, passed=False, summary=f"nvidia-smi: unexpected line {line.strip()[:120]!r}",
                           evidence={"output": _tail(text)})
        idx, model, bus, driver, ecc, mode = (parts[c] for c in cols)
        gpus.append({"index": idx, "name": model, "bus_id": bus, "driver": driver, "ecc_uncorrected": ecc,
                     "ecc_mode": mode})
        if expect_ecc and mode != "Enabled":
            problems.append(f"GPU {idx} ECC mode {mode} (the SKU expects ECC on)")
        elif expect_ecc and ecc in _NOT_READ:
            problems.append(f"GPU {idx} uncorrected ECC count not reported ({ecc})")
        if ecc not in _NOT_READ:
            try:
                n = int(ecc)
            except ValueError:
                problems.append(f"GPU {idx} ECC count unreadable ({ecc!r})")
            else:
                if n > 0:
                    problems.append(f"GPU {idx} has {n} uncorrected ECC errors")
        if expected_driver is not None and driver != expected_driver:
            problems.append(f"GPU {idx} driver {driver} (expected {expected_driver})")
    ev = {"gpus": gpus, "expected_gpus": expected_gpus}
    if not gpus:
        return Verdict(check=name, passed=False, summary=f"nvidia-smi: no GPUs listed (exit {rc}): {_seen(text)}",
                       evidence={**ev, "output": _tail(text)})
    buses = [g["bus_id"] for g in gpus if g["bus_id"] not in _NOT_READ]
    twice = sorted({b for b in buses if buses.count(b) > 1})
    if twice:  # one GPU listed twice is not two GPUs: the report does not show the SKU's count
        problems.insert(0, f"PCI bus id {', '.join(twice[:2])} listed more than once "
                           f"({len(set(buses))} distinct GPUs in {len(gpus)} rows)")
    if len(gpus) != expected_gpus:
        problems.insert(0, f"{len(gpus)} of {expected_gpus} GPUs visible")
    if problems:
        return Verdict(check=name, passed=False, summary="nvidia-smi: " + "; ".join(problems[:4]), evidence=ev)
    return Verdict(check=name, passed=True, summary=f"nvidia-smi: {len(gpus)} GPUs, driver {gpus[0]['driver']}",
                   evidence=ev)


# ---- dcgmi diag -r N -j -------------------------------------------------------------------------
_DCGM_RAN = frozenset({"pass", "passed", "fail", "failed", "error", "warn", "warning"})
_DCGM_FAILED = frozenset({"fail", "failed", "error"})


def _dcgm_status(value: Any) -> str:
    """A result status ("Pass", "Fail", "Warn", "Skip", "Not Run", other spellings) as one lower-case word."""
    return re.sub(r"[\s_-]+", "", str(value or "")).lower()


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


_SOFTWARE = frozenset({"deployment", "software"})  # the category (3.x) or test (4.x) of the software checks


def _gpu_ids(res: dict[str, Any]) -> list[int] | None:
    """The GPUs a result is about: `gpu_ids` ("0,1,2" or a number; DCGM <= 3.2), `gpu_id` (3.3), or a GPU
    `entity_id` (4.x). None: a result about no GPU in particular (a software check)."""
    for key in ("gpu_ids", "gpu_id"):
        if key in res and res[key] is not None and str(res[key]).strip() != "":
            return [int(x) for x in re.findall(r"\d+", str(res[key]))]
    if "entity_id" in res and str(res.get("entity_group", "GPU")).upper() == "GPU":
        return [int(res["entity_id"])]
    return None


def parse_dcgmi_diag(text: str, rc: int, *, level: int, expected_gpus: int | None = None,
                     may_skip: dict[str, str] | None = None) -> Verdict:
    """`dcgmi diag -r N -j`: DCGM 3.x ("DCGM GPU Diagnostic") and 4.x ("DCGM Diagnostic") layouts, decided per GPU.

    Every hardware test the report lists (all but the software checks, which always run) must have run
    and passed on every expected GPU (0..expected_gpus-1): a Fail fails (DCGM 3.x and 4.x print warnings as
    Fail too); a Skip, a Not Run or a GPU missing from a test's results fails, but for a test `may_skip`
    names (with the reason shown). A report that lists fewer GPUs than expected fails, and so does one with
    no hardware test at level 2 or more: it tested nothing on the hardware.
    """
    name = "dcgm"
    may_skip = {k.lower(): v for k, v in (may_skip or {}).items()}
    start, end = text.find("{"), text.rfind("}")
    try:
        doc = json.loads(text[start:end + 1]) if start >= 0 else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return Verdict(check=name, passed=False,
                       summary=f"dcgmi diag -r {level}: no JSON report (exit {rc}): {_tail(text, 160)}",
                       evidence={"rc": rc, "output": _tail(text)})
    body = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic")
    body = body if isinstance(body, dict) else {}
    meta = doc.get("metadata")
    version = body.get("version") or doc.get("version") or (meta.get("version") if isinstance(meta, dict) else None)
    runtime_error = body.get("runtime_error") or doc.get("runtime_error")
    if isinstance(runtime_error, str) and runtime_error.strip():
        return Verdict(check=name, passed=False,
                       summary=f"dcgmi diag -r {level}: {runtime_error.strip()[:200]} (exit {rc})",
                       evidence={"rc": rc, "version": version, "output": _tail(text)})
    cats = body.get("test_categories")
    if not isinstance(cats, list):
        return Verdict(check=name, passed=False,
                       summary=f"dcgmi diag -r {level}: report has no test_categories (exit {rc}): {_seen(text)}",
                       evidence={"rc": rc, "version": version, "output": _tail(text)})
    failures: list[str] = []
    unseen: list[str] = []
    allowed: list[str] = []
    software_run = 0
    hardware: dict[str, dict[int, str]] = {}  # test -> GPU -> status
    gpus_seen: set[int] = set()
    for cat in cats:
        if not isinstance(cat, dict):
            continue
        software_cat = str(cat.get("category", "")).strip().lower() in _SOFTWARE
        tests = cat.get("tests")
        for test in tests if isinstance(tests, list) else []:
            if not isinstance(test, dict):
                continue
            tname = str(test.get("name", "?"))
            software = software_cat or tname.strip().lower() in _SOFTWARE
            per_gpu = hardware.setdefault(tname, {}) if not software else None
            results = test.get("results")
            failed = False
            for res in results if isinstance(results, list) else []:
                if not isinstance(res, dict):
                    continue
                status = _dcgm_status(res.get("status"))
                ids = _gpu_ids(res)
                gpus_seen.update(ids or [])
                if status in _DCGM_FAILED or status in ("warn", "warning"):
                    failed = True
                    why = "; ".join(_warning_texts(res)) or status
                    failures.append(f"{tname} on GPU {','.join(map(str, ids)) if ids else '-'}: {why}")
                if software:
                    software_run += status in _DCGM_RAN
                elif per_gpu is not None:
                    for g in ids if ids is not None else []:
                        per_gpu[g] = status if per_gpu.get(g) in (None, "pass", "passed") else per_gpu[g]
            summary = test.get("test_summary")  # DCGM 4.x: the test's own status, next to its results
            if isinstance(summary, dict) and _dcgm_status(summary.get("status")) in _DCGM_FAILED and not failed:
                failures.append(f"{tname}: " + ("; ".join(_warning_texts(summary)) or "failed"))
    want = set(range(expected_gpus)) if expected_gpus else set(gpus_seen)
    for tname, per_gpu in hardware.items():
        missed = sorted(g for g in want if per_gpu.get(g) not in ("pass", "passed", "fail", "failed", "error",
                                                                   "warn", "warning"))
        if not missed:
            continue
        how = sorted({per_gpu.get(g) or "absent" for g in missed})
        what = f"{tname}: {'/'.join(how)} on GPU {','.join(map(str, missed))}"
        if tname.strip().lower() in may_skip:
            allowed.append(f"{what} (allowed: {may_skip[tname.strip().lower()]})")
        else:
            unseen.append(what)
    ev = {"tests": len(hardware), "software_checks": software_run, "gpus_in_report": sorted(gpus_seen),
          "expected_gpus": expected_gpus, "failures": failures[:20], "not_run": unseen[:20], "allowed_skips": allowed,
          "version": version, "rc": rc}
    if failures:
        return Verdict(check=name, passed=False, summary=f"dcgmi diag -r {level}: " + " | ".join(failures[:3]),
                       evidence=ev)
    if not hardware and level >= 2:
        return Verdict(check=name, passed=False,
                       summary=f"dcgmi diag -r {level}: 0 hardware tests in the report ({software_run} software "
                               f"check(s) only; exit {rc})", evidence={**ev, "output": _tail(text)})
    if not hardware and not software_run:
        return Verdict(check=name, passed=False, summary=f"dcgmi diag -r {level}: 0 tests run (exit {rc})",
                       evidence={**ev, "output": _tail(text)})
    # level 1 runs the deployment checks only, and DCGM names a GPU in one only when it failed (dcgmi/Diag.cpp):
    # a level-1 report that names no GPU says nothing of the count, which the inventory check sees
    count_unseen = level < 2 and not hardware and not gpus_seen
    if expected_gpus and len(gpus_seen) < expected_gpus and not count_unseen:
        return Verdict(check=name, passed=False,
                       summary=f"dcgmi diag -r {level}: the report lists {len(gpus_seen)} of {expected_gpus} GPUs "
                               f"({', '.join(map(str, sorted(gpus_seen))) or 'none'})", evidence=ev)
    if hardware and not want:
        return Verdict(check=name, passed=False,
                       summary=f"dcgmi diag -r {level}: {len(hardware)} test(s) listed, no GPU named in any result "
                               f"(exit {rc})", evidence={**ev, "output": _tail(text)})
    if unseen:
        return Verdict(check=name, passed=False,
                       summary=f"dcgmi diag -r {level}: tested nothing on some GPUs: " + " | ".join(unseen[:3]),
                       evidence=ev)
    if rc != 0:
        return Verdict(check=name, passed=False, summary=f"dcgmi diag -r {level}: exit {rc}", evidence=ev)
    extra = f", skips allowed: {'; '.join(allowed)}" if allowed else ""
    if count_unseen:
        return Verdict(check=name, passed=True,
                       summary=f"dcgmi diag -r {level}: {software_run} deployment checks passed (no GPU named)",
                       evidence=ev)
    return Verdict(check=name, passed=True,
                   summary=f"dcgmi diag -r {level}: {len(hardware)} hardware tests passed on {len(want)} GPUs{extra}",
                   evidence=ev)


# ---- all_reduce_perf (nccl-tests) --------------------------------------------------------------
# a figure, in the exponent form %g-style formats print for large ones (a time of 10 s or more: `1.2e+07`),
# or N/A for a figure it has not got
_N = r"(?:\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|N/A)"
# rows as an MPI launcher tags them: Open MPI's --tag-output `[1,0]<stdout>:`, srun -l's `0: `
_RANK_TAG = r"\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:(?=\s))?"
_NCCL_ROW = re.compile(
    rf"^{_RANK_TAG}\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>\w+)\s+(?P<redop>\w+)(?:\s+(?P<root>-?\d+))?"
    rf"\s+(?P<t1>{_N})\s+(?P<alg1>{_N})\s+(?P<bus1>{_N})\s+(?P<wrong1>\S+)"
    rf"\s+(?P<t2>{_N})\s+(?P<alg2>{_N})\s+(?P<bus2>{_N})\s+(?P<wrong2>\S+)\s*$"
)
_NCCL_AVG = re.compile(rf"^{_RANK_TAG}\s*#\s*Avg bus bandwidth\s*:\s*(?P<bw>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)")
_NCCL_OOB = re.compile(rf"^{_RANK_TAG}\s*#\s*Out of bounds values\s*:\s*(?P<n>\d+)\s*(?P<state>\w+)?")
# the sizes asked for: `# nThread 1 nGpus 8 minBytes 8 maxBytes 8589934592 step: 2(factor) ...` (or `step: 1024(bytes)`)
_NCCL_ASKED = re.compile(rf"^{_RANK_TAG}\s*#\s*nThread.*\bmaxBytes\s+(?P<max>\d+)"
                         r"\s+step:\s*(?P<step>\d+)\((?P<kind>\w+)\)")


def _gbps(value: str) -> float:
    """A bandwidth cell: its figure, 0.0 for N/A (no measurement is no bandwidth)."""
    try:
        return float(value)
    except ValueError:
        return 0.0


def _reaches(largest: int, max_bytes: int, step: int, kind: str) -> bool:
    """Whether a row of `largest` bytes is the last size the run was asked for: the next step would pass
    maxBytes (sizes are rounded down to whole elements, so the last may sit a little below it)."""
    nxt = largest * step if kind == "factor" else largest + step
    return nxt > max_bytes or largest >= max_bytes


def parse_all_reduce_perf(text: str, rc: int, *, floor_gbps: float) -> Verdict:
    """Bus bandwidth at the largest message size (the NVLink/IB-bound figure) against the SKU floor.

    Seen means at least one row with a bus bandwidth above 0, and one at the largest size; `#wrong`
    N/A (no data check) is reported as unvalidated, never as correct.
    """
    name = "nccl"
    rows = []
    avg = None
    oob = None
    asked: tuple[int, int, str] | None = None
    for line in text.splitlines():
        m = _NCCL_ROW.match(line)
        if m:
            rows.append(m)
            continue
        a = _NCCL_AVG.match(line.strip())
        if a:
            avg = float(a["bw"])
        o = _NCCL_OOB.match(line.strip())
        if o:
            oob = (int(o["n"]), (o["state"] or "").upper())
        k = _NCCL_ASKED.match(line.strip())
        if k:
            asked = (int(k["max"]), int(k["step"]), k["kind"])
    if not rows:
        return Verdict(check=name, passed=False, summary=f"all_reduce_perf: no result rows (exit {rc}): {_seen(text)}",
                       evidence={"rc": rc, "output": _tail(text)})
    measured = [m for m in rows if max(_gbps(m["bus1"]), _gbps(m["bus2"])) > 0]
    if not measured:
        cells = sorted({m[k] for m in rows for k in ("bus1", "bus2")})
        return Verdict(check=name, passed=False,
                       summary=f"all_reduce_perf: {len(rows)} result row(s), none with a bus bandwidth "
                               f"(busbw {', '.join(cells)}; exit {rc})",
                       evidence={"rc": rc, "rows": len(rows), "output": _tail(text)})
    last = max(rows, key=lambda m: int(m["size"]))
    busbw = max(_gbps(last["bus1"]), _gbps(last["bus2"]))
    if asked is not None and not _reaches(int(last["size"]), *asked):
        return Verdict(check=name, passed=False,
                       summary=f"all_reduce_perf: the largest size asked for ({asked[0]} B) has no result row "
                               f"(largest read: {int(last['size'])} B)",
                       evidence={"rc": rc, "rows": len(rows), "max_bytes": asked[0], "largest_row": int(last["size"]),
                                 "output": _tail(text)})
    # `#wrong` is a count; nccl-tests before 2.13 printed the largest error instead (`5e-07`), which says
    # nothing about a count: such a run is reported unvalidated, as N/A is
    wrongs = [(m["size"], w) for m in rows for w in (m["wrong1"], m["wrong2"]) if re.fullmatch(r"\d+|N/A", w)]
    wrong = [size for size, w in wrongs if w not in ("0", "N/A")]
    validated = bool(wrongs) and len(wrongs) == 2 * len(rows) and all(w == "0" for _, w in wrongs)
    ev = {"size_bytes": int(last["size"]), "busbw_gbps": busbw, "avg_busbw_gbps": avg, "floor_gbps": floor_gbps,
          "wrong_sizes": wrong, "validated": validated, "rows": len(rows), "rc": rc}
    if wrong:
        return Verdict(check=name, passed=False,
                       summary=f"all_reduce_perf: wrong results at sizes {', '.join(wrong[:3])}", evidence=ev)
    if oob is not None and (oob[0] > 0 or oob[1] not in ("", "OK")):
        return Verdict(check=name, passed=False,
                       summary=f"all_reduce_perf: {oob[0]} out-of-bounds values ({oob[1] or '?'})", evidence=ev)
    if rc != 0:
        return Verdict(check=name, passed=False, summary=f"all_reduce_perf: exit {rc}", evidence=ev)
    if busbw <= 0:
        return Verdict(check=name, passed=False,
                       summary=f"all_reduce_perf: no bus bandwidth at the largest size {int(last['size'])} B "
                               f"(busbw {last['bus1']} / {last['bus2']})", evidence=ev)
    if busbw < floor_gbps:
        return Verdict(check=name, passed=False,
                       summary=f"all_reduce_perf: bus bandwidth {busbw:.1f} GB/s below floor {floor_gbps:.1f} GB/s "
                               f"at {int(last['size'])} B", evidence=ev)
    note = "" if validated else " (results not validated: #wrong N/A)"
    return Verdict(check=name, passed=True, summary=f"all_reduce_perf: bus bandwidth {busbw:.1f} GB/s{note}",
                   evidence=ev)


# ---- XID errors in the kernel log --------------------------------------------------------------
# The driver's own form (NVIDIA/open-gpu-kernel-modules): `NVRM: Xid (PCI:0000:3b:00): 79, ...`, and on a GPU with
# MIG enabled the instance after the address: `(PCI:0000:01:00 GPU-I:05)`, `(PCI:0000:01:00 GPU-I:01 GPU-CI:02)`.
_XID_RE = re.compile(r"NVRM: Xid \((?P<pci>PCI:[0-9A-Fa-f:.]+)(?P<mig>(?:\s+GPU-C?I:\s*\d+)*)\s*\):\s*(?P<xid>\d+)"
                     r"(?:,\s*(?P<detail>.*))?")
# A line of the kernel log itself, as `XID_COMMAND` prints it: dmesg's `[    4.812345] ...` (or
# `[Mon Jan  6 10:00:00 2025] ...` under -T, `kern  :info  : [...]` under -x, `<6>[...]` raw), or a
# journalctl kernel line (`Jan  6 10:00:00 gpu-a01 kernel: ...`, -o short-iso, short-monotonic).
_KERNEL_LINE = re.compile(
    r"^(?:[a-z]+\s*:\s*[a-z]+\s*:\s*)?(?:<\d+>)?"
    r"\[(?:\s*\d+\.\d+|[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]"
    r"|^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: "
    r"|^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S* \S+ kernel: "
)


def parse_xid(text: str, rc: int, *, fatal: list[int] | tuple[int, ...]) -> Verdict:
    """Fatal XIDs in the kernel log. Seen means at least one line shaped like the kernel log's own:
    an unreadable log (dmesg_restrict, journalctl's hints, no output) fails with what came back."""
    name = "xid"
    seen: list[dict[str, Any]] = []
    kernel_lines = 0
    for line in text.splitlines():
        if _KERNEL_LINE.match(line):
            kernel_lines += 1
        m = _XID_RE.search(line)
        if m:
            where = m["pci"] + (" " + " ".join(m["mig"].split()) if m["mig"] else "")
            seen.append({"pci": where, "xid": int(m["xid"]), "detail": (m["detail"] or "").strip()[:160]})
    bad = [x for x in seen if x["xid"] in set(fatal)]
    ev = {"xids": seen[-20:], "fatal": sorted(set(fatal)), "kernel_lines": kernel_lines, "rc": rc}
    if bad:
        first = bad[0]
        return Verdict(check=name, passed=False,
                       summary=f"XID {first['xid']} on {first['pci']}: {first['detail'] or 'fatal XID'}"
                               + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""), evidence=ev)
    if not kernel_lines:
        return Verdict(check=name, passed=False, summary=f"kernel log not readable (exit {rc}): {_seen(text)}",
                       evidence={**ev, "output": _tail(text)})
    if rc != 0:
        return Verdict(check=name, passed=False,
                       summary=f"kernel log read failed (exit {rc}) after {kernel_lines} line(s): {_tail(text, 160)!r}",
                       evidence={**ev, "output": _tail(text)})
    return Verdict(check=name, passed=True,
                   summary=f"kernel log: {kernel_lines} line(s), {len(seen)} XID line(s), none fatal", evidence=ev)


# ---- versions ------------------------------------------------------------------------------------
def check_versions(found: dict[str, str], expected: dict[str, str]) -> Verdict:
    wrong = {c: {"expected": v, "found": found.get(c)} for c, v in expected.items() if found.get(c) != v}
    if wrong:
        desc = ", ".join(f"{c} {w['found'] or 'unknown'} (expected {w['expected']})" for c, w in wrong.items())
        return Verdict(check="versions", passed=False, summary=f"versions: {desc}",
                       evidence={"found": found, "wrong": wrong})
    return Verdict(check="versions", passed=True, summary="versions at target", evidence={"found": found})


def judge(name: str, text: str, rc: int, *, spec: HealthChecksSpec, sku: str, expected: dict[str, str]) -> Verdict:
    """One catalog check's verdict from its raw output."""
    if name == "gpu_inventory":
        drv = expected.get(spec.driver_component) if spec.driver_component else None
        return parse_nvidia_smi(text, rc, expected_gpus=spec.gpus(sku), expected_driver=drv,
                                expect_ecc=spec.ecc_on(sku))
    if name == "dcgm":
        return parse_dcgmi_diag(text, rc, level=spec.dcgm_level, expected_gpus=spec.gpus(sku),
                                may_skip=spec.dcgm_may_skip)
    if name == "nccl":
        return parse_all_reduce_perf(text, rc, floor_gbps=spec.nccl_min_busbw_gbps.get(sku, 0.0))
    if name == "xid":
        return parse_xid(text, rc, fatal=spec.fatal_xids)
    raise ValueError(f"unknown check {name!r}")
