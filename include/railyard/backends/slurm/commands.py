"""Running the Slurm CLI: argv lists only, locally or on the controller over SSH.

Every argument is checked before it is used (`check_arg`); over SSH each one is quoted on its own,
so no shell ever sees an unchecked string. A controller that does not answer (restart, failover)
is waited out for `controller_wait_s`, because every caller is idempotent and a retry is safe.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence

from railyard.domain.config.slurm import SlurmSpec
from railyard.fleet.port import FleetError

log = logging.getLogger("railyard.slurm")

# key=value arguments Slurm takes: names, lists of names, reasons, times. No quotes, no shell
# metacharacters, no newlines.
ARG_MAX = 512  # the longest argument `check_arg` lets through: hostlists longer than that are split (`chunks`)
_ARG_RE = re.compile(rf"^[A-Za-z0-9_.,=:@/+\[\] -]{{1,{ARG_MAX}}}$")
_UNREACHABLE = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Zero Bytes were transmitted",
    "Connection refused",
    "Unable to establish controller machine",
    "slurm_load_",
    "Communication connection failure",
)


class SlurmUnreachable(FleetError):
    """slurmctld did not answer within `controller_wait_s`."""


def check_arg(arg: str) -> str:
    if not isinstance(arg, str) or not _ARG_RE.match(arg) or arg.startswith("-") and " " in arg:
        raise FleetError(f"refusing Slurm argument {arg!r}: only letters, digits and _.,=:@/+[]- and spaces")
    return arg


def is_write(argv: Sequence[str]) -> bool:
    """Everything but `sinfo`, `squeue`, `scontrol [--json] show ...` and `scontrol --version` changes the
    cluster."""
    if not argv:
        return False
    if argv[0] in ("sinfo", "squeue"):
        return False
    if argv[0] != "scontrol":
        return True
    words = [a for a in argv[1:] if not a.startswith("-")]
    return not ((words and words[0] == "show") or list(argv[1:]) == ["--version"])


class SlurmCli:
    """Runs `argv` where the config says; returns stdout, raises FleetError with Slurm's own words.

    The one place every Slurm command passes: each write is logged and kept in `writes`, so a read
    path can be proven to have changed nothing.
    """

    def __init__(self, spec: SlurmSpec, *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, read_only: bool = False):
        self.spec = spec
        self.read_only = read_only  # a reader's CLI (the page, plan, drift): every write is refused
        self.sleep = sleep
        self.clock = clock
        self.writes: list[tuple[str, ...]] = []

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}  # the CLI must use munge
        if self.spec.slurm_conf:
            env["SLURM_CONF"] = self.spec.slurm_conf
        return env

    def _wrap(self, argv: Sequence[str]) -> list[str]:
        if self.spec.transport == "local":
            return list(argv)
        ssh = self.spec.ssh
        assert ssh is not None  # the config refuses transport ssh without it
        remote = " ".join(shlex.quote(a) for a in argv)
        if self.spec.slurm_conf:
            remote = f"SLURM_CONF={shlex.quote(self.spec.slurm_conf)} {remote}"
        return ["ssh", "-p", str(ssh.port), "-i", ssh.key_file, "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={ssh.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", f"ConnectTimeout={int(ssh.connect_timeout_s)}", f"{ssh.user}@{ssh.host}", "--", remote]

    def run(self, *argv: str, retry: bool = True) -> str:
        for a in argv:
            check_arg(a)
        if is_write(argv) and self.read_only:
            raise FleetError(f"this Slurm fleet only reads (the Railyard page, plan, drift): refusing {argv[0]} "
                             f"{argv[1] if len(argv) > 1 else ''}")
        if is_write(argv):
            self.writes.append(tuple(argv))
            log.info("slurm write: %s", " ".join(argv))
        cmd = self._wrap(argv)
        deadline = self.clock() + (self.spec.controller_wait_s if retry else 0)
        delay = 0.5
        while True:
            try:
                p = subprocess.run(cmd, env=self._env(), capture_output=True, text=True,
                                   timeout=self.spec.command_timeout_s)
            except subprocess.TimeoutExpired:
                out, err, code = "", f"timed out after {self.spec.command_timeout_s}s", -1
            except OSError as exc:
                raise FleetError(f"cannot run {argv[0]}: {exc}") from None
            else:
                out, err, code = p.stdout, p.stderr.strip(), p.returncode
            if code == 0:
                return out
            unreachable = code == -1 or any(m in err for m in _UNREACHABLE)
            if not unreachable:
                raise FleetError(f"{' '.join(argv)}: {err or f'exit {code}'}")
            if self.clock() >= deadline:
                raise SlurmUnreachable(f"{' '.join(argv)}: slurmctld unreachable: {err}")
            log.warning("slurmctld unreachable (%s); retrying in %.1fs", err, delay)
            self.sleep(delay)
            delay = min(delay * 2, 5.0)




def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist: 'n[1-3,5],gpu-a07' -> n1 n2 n3 n5 gpu-a07 (zero padding kept)."""
    out: list[str] = []
    i = 0
    while i < len(expr):
        j = i
        depth = 0
        while j < len(expr) and (expr[j] != "," or depth):
            depth += {"[": 1, "]": -1}.get(expr[j], 0)
            j += 1
        item = expr[i:j]
        i = j + 1
        if not item:
            continue
        m = re.fullmatch(r"(.*?)\[([^\]]*)\](.*)", item)
        if not m:
            out.append(item)
            continue
        prefix, body, suffix = m.groups()
        for part in body.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                width = len(lo) if lo.startswith("0") else 0
                out.extend(f"{prefix}{k:0{width}d}{suffix}" for k in range(int(lo), int(hi) + 1))
            else:
                out.append(f"{prefix}{part}{suffix}")
    return out


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def compress_hostlist(names: Sequence[str]) -> str:
    """The names in Slurm's hostlist syntax, sorted by prefix and number: n3,n1,n2,gpu-a09,gpu-a10 ->
    gpu-a[09-10],n[1-3], what `scontrol show hostnames` expands back to the same names (the Slurm tier checks
    it against the real tool). Only a trailing number is ranged; a name without one is kept as it is. A number
    with leading zeros ranges with the others of its width (gpu-a[098-100])."""
    plain: set[str] = set()
    groups: dict[str, set[str]] = {}
    for name in names:
        m = _NUMBERED.match(name)
        if m is None or "[" in name or "]" in name or "," in name:
            plain.add(name)
        else:
            groups.setdefault(m.group(1), set()).add(m.group(2))
    parts: list[tuple[str, int, str]] = [(n, 0, n) for n in plain]
    for prefix, digits in groups.items():
        padded = {len(d) for d in digits if d.startswith("0") and len(d) > 1}
        by_width: dict[int, list[int]] = {}
        for d in digits:
            by_width.setdefault(len(d) if len(d) in padded else 0, []).append(int(d))
        for width, nums in by_width.items():
            nums.sort()
            runs: list[str] = []
            lo = prev = nums[0]
            for k in [*nums[1:], None]:
                if k is not None and k == prev + 1:
                    prev = k
                    continue
                runs.append(f"{lo:0{width}d}" if lo == prev else f"{lo:0{width}d}-{prev:0{width}d}")
                if k is not None:
                    lo = prev = k
            body = runs[0] if len(nums) == 1 else f"[{','.join(runs)}]"
            parts.append((prefix, nums[0], f"{prefix}{body}"))
    return ",".join(text for _p, _n, text in sorted(parts))


def chunks(names: Sequence[str], key: str = "", limit: int = ARG_MAX) -> list[str]:
    """`key` + a hostlist of `names`, as few arguments as fit in `limit` characters each (one, unless the
    names compress badly: thousands of names with gaps). Each chunk is a run of the sorted names."""
    ordered = expand_hostlist(compress_hostlist(names))
    whole = key + compress_hostlist(ordered)
    if len(whole) <= limit:
        return [whole] if ordered else []
    out: list[str] = []
    start = 0
    while start < len(ordered):
        lo, hi = start + 1, len(ordered)  # the longest run from `start` that fits: binary search
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(key) + len(compress_hostlist(ordered[start:mid])) <= limit:
                lo = mid
            else:
                hi = mid - 1
        out.append(key + compress_hostlist(ordered[start:lo]))
        start = lo
    return out


def joined(items: Sequence[str], key: str = "", limit: int = ARG_MAX) -> list[str]:
    """`key` + the items comma-joined (job ids), as few arguments as fit in `limit` characters each."""
    out: list[str] = []
    cur = ""
    for item in items:
        if cur and len(key) + len(cur) + 1 + len(item) > limit:
            out.append(key + cur)
            cur = ""
        cur = f"{cur},{item}" if cur else item
    if cur:
        out.append(key + cur)
    return out
