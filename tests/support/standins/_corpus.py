"""What the GPU stand-ins print: samples of the real tools' output from tests/fixtures/real/, chosen by host profile.

A stand-in prints a recorded sample as it is. Where a value must follow the host (the driver a train just installed,
a GPU gone from the bus), the change is named in the stand-in, and `tests/fixtures/real/STANDINS.md` lists every one.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "real"


def state() -> Path:
    return Path(os.environ["RAILYARD_HOST_STATE"])


def profile() -> str:
    return (state() / "profile").read_text().strip()


def installed(component: str, default: str) -> str:
    p = state() / "versions" / component
    return p.read_text().strip() if p.exists() else default


def sample(tool: str, name: str) -> str:
    return (CORPUS / tool / name).read_text()


def emit(text: str, rc: int = 0) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
    sys.exit(rc)


def query_rows(q_report: str) -> list[dict[str, str]]:
    """Per GPU of a recorded `nvidia-smi -q` report, the values of the fields Railyard's csv query asks for.

    csv prints `[N/A]` where -q prints `N/A` (as the recorded csv captures show); the volatile uncorrected total is
    the sum of the report's volatile uncorrectable counters, or `[N/A]` when it has none."""
    driver = re.search(r"^Driver Version\s*:\s*(\S+)", q_report, re.M)
    gpus = []
    for i, block in enumerate(re.split(r"^GPU (?=[0-9A-Fa-f]{8}:)", q_report, flags=re.M)[1:]):
        name = re.search(r"^\s{4}Product Name\s*:\s*(.+?)\s*$", block, re.M)
        bus = re.search(r"^\s+Bus Id\s*:\s*(\S+)", block, re.M)
        mode = re.search(r"^\s{4}ECC Mode\n\s+Current\s*:\s*(\S+)", block, re.M)
        vol = re.search(r"^\s{8}Volatile\n((?:\s{12}.+\n)+)", block, re.M)
        counts = re.findall(r"Uncorrectable[^:]*:\s*(\S+)", vol.group(1)) if vol else []
        total = str(sum(int(c) for c in counts)) if counts and all(c.isdigit() for c in counts) else "[N/A]"
        gpus.append({"index": str(i), "name": name.group(1) if name else "[N/A]",
                     "pci.bus_id": bus.group(1) if bus else "[N/A]",
                     "driver_version": driver.group(1) if driver else "[N/A]",
                     "ecc.errors.uncorrected.volatile.total": total,
                     "ecc.mode.current": mode.group(1) if mode else "[N/A]"})
    return gpus
