"""Reading Slurm's JSON (`sinfo`/`scontrol show nodes`/`squeue --json`, slurmrestd) across versions.

Slurm changed these shapes from release to release, so every read of a Slurm field goes through here:

- 22.05 (openapi/v0.0.38): `"state": "idle", "state_flags": ["DRAIN"]`; features a comma string;
  `job_state` one word (which may be a flag such as "COMPLETING"); numbers plain; an unlimited
  `time_limit` is null.
- 23.02+ (data_parser v0.0.39 on): `"state": ["IDLE", "DRAIN"]` with no `state_flags`; features
  lists; many numbers as `{"set": bool, "infinite": bool, "number": n}`; `sinfo --json` no longer
  lists nodes under "nodes" but groups them under "sinfo" (`scontrol show nodes --json` has "nodes").
- 23.11+ (v0.0.40): `job_state` a list, times as number objects.
- 24.05+ (v0.0.41): `job_resources.nodes` an object (`list`, `allocation`) instead of a hostlist.

Pure functions, no I/O. A missing field gives a default; a field of the wrong type raises ValueError
naming the field and the value, so garbage is reported where it is read, never deep inside a caller.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from railyard.backends.slurm.commands import expand_hostlist

__all__ = [
    "NODE_BASE_STATES",
    "JOB_BASE_STATES",
    "number",
    "node_records",
    "node_name",
    "node_state",
    "node_reason",
    "node_reason_user",
    "node_features",
    "node_active_features",
    "node_address",
    "gpus_per_node",
    "gres_count",
    "job_state",
    "job_flags",
    "job_nodes",
    "job_node_count",
    "job_id",
    "job_comment",
    "job_gpus",
    "job_time",
]

# Slurm's node_states enum (slurm.h NODE_STATE_*): everything else in a state list is a flag.
NODE_BASE_STATES = frozenset({"UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE"})
# Short spellings of base states (sinfo %t) and derived names that stand for a base state plus a
# flag (sinfo %T "drained"/"draining"): only a fallback when no real base state is given.
_NODE_BASE_ALIASES = {"ALLOC": "ALLOCATED", "MIX": "MIXED"}
_NODE_DERIVED = {"DRAINED": "IDLE", "DRAINING": "ALLOCATED", "DRNG": "ALLOCATED"}
# Slurm's job_states enum (slurm.h JOB_*): everything else in a job_state list is a flag.
JOB_BASE_STATES = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
    "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
})
# 22.05's job_state is job_state_string(): a set flag wins over the base state. Where the flag
# implies the base state, say it; COMPLETING and STAGE_OUT hide it (any end state), so they stay.
_JOB_FLAG_BASE = {
    "CONFIGURING": "RUNNING", "RESIZING": "RUNNING", "SIGNALING": "RUNNING", "STOPPED": "RUNNING",
    "POWER_UP_NODE": "RUNNING", "REQUEUED": "PENDING", "REQUEUE_FED": "PENDING",
    "REQUEUE_HOLD": "PENDING", "SPECIAL_EXIT": "PENDING", "RESV_DEL_HOLD": "PENDING",
    "REVOKED": "CANCELLED", "COMPLETING": "COMPLETING", "STAGE_OUT": "COMPLETING",
}
# uint32 sentinels older versions write as plain numbers (slurm.h NO_VAL / INFINITE).
_NO_VAL = 0xFFFFFFFE
_INFINITE = 0xFFFFFFFF
_EMPTY_GRES = {"", "(null)", "n/a", "none"}
_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


# ---- helpers ----------------------------------------------------------------------------------------

def _bad(field: str, value: Any, expected: str) -> ValueError:
    """One message shape for every wrong type, so a log line names the field and what Slurm sent."""
    shown = repr(value)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return ValueError(f"Slurm field {field!r}: expected {expected}, got {shown}")


def _record(obj: Any, what: str) -> Mapping[str, Any]:
    """Every accessor takes one JSON object; anything else is a caller's or Slurm's mistake."""
    if not isinstance(obj, Mapping):
        raise _bad(what, obj, "a JSON object")
    return obj


def _text(v: Any, field: str, default: str = "") -> str:
    """A string field; None (older versions write null for unset) gives the default."""
    if v is None:
        return default
    if isinstance(v, str):
        return v
    raise _bad(field, v, "a string")


def _words(v: Any, field: str, seps: str = ",") -> list[str]:
    """A list of strings, a separated string, or None: the many ways Slurm spells a set."""
    if v is None:
        return []
    if isinstance(v, str):
        return [w.strip() for w in re.split(f"[{re.escape(seps)}]", v) if w.strip()]
    if isinstance(v, list):
        out: list[str] = []
        for w in v:
            if not isinstance(w, str):
                raise _bad(field, v, "a list of strings")
            if w.strip():
                out.append(w.strip())
        return out
    raise _bad(field, v, "a string or a list of strings")


def _is_sinfo_entry(node: Mapping[str, Any]) -> bool:
    """23.02+ `sinfo --json` rows nest the state under "node" and the names under "nodes"."""
    return isinstance(node.get("node"), Mapping) and isinstance(node.get("nodes"), Mapping)


def _hosts(v: Any, field: str) -> list[str]:
    """Host names from a hostlist string or a list of names/hostlists (commas inside [] kept)."""
    if v is None:
        return []
    if isinstance(v, str):
        hosts: list[str] = expand_hostlist(v.strip())
        return hosts
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _bad(field, v, "a hostlist string or a list of host names")
    out: list[str] = []
    for x in v:
        out.extend(expand_hostlist(str(x).strip()))
    return out


def _split_top(spec: str) -> list[str]:
    """Split on commas outside parentheses: "gpu:4(S:0,2),shard:8" is two items, not three."""
    items: list[str] = []
    depth = 0
    cur = ""
    for ch in spec:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [i.strip() for i in items if i.strip()]


def _count(text: str, field: str, spec: str) -> int:
    """A gres count, with Slurm's K/M/G/T/P suffixes."""
    m = re.fullmatch(r"(\d+)([KMGTP]?)", text.strip().upper())
    if not m:
        raise _bad(field, spec, "a gres count like 'gpu:8' or 'gpu:h100:8'")
    return int(m.group(1)) * _SUFFIX[m.group(2)]


# ---- numbers -----------------------------------------------------------------------------------------

def number(v: Any, default: float | None = None, *, field: str = "number") -> float | None:
    """A plain number or 23.02+'s {"set", "infinite", "number"}: unset gives default, infinite inf."""
    if v is None:
        return default
    if isinstance(v, bool):
        raise _bad(field, v, "a number or {set, infinite, number}")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, Mapping):
        infinite = v.get("infinite", False)
        is_set = v.get("set", True)
        if not isinstance(infinite, bool) or not isinstance(is_set, bool):
            raise _bad(field, v, "{set: bool, infinite: bool, number: n}")
        if infinite:
            return math.inf
        if not is_set:
            return default
        n = v.get("number")
        if n is None:
            return default
        if isinstance(n, bool) or not isinstance(n, (int, float)):
            raise _bad(field, v, "{set: bool, infinite: bool, number: n}")
        return float(n)
    raise _bad(field, v, "a number or {set, infinite, number}")


# ---- nodes -------------------------------------------------------------------------------------------

def node_records(doc: Any) -> list[dict[str, Any]]:
    """One record per node from any node document: 22.05 `sinfo --json`, `scontrol --json show nodes` and
    slurmrestd ("nodes"), or 23.02+ `sinfo -N --json` ("sinfo" rows of one node each; the first row wins
    when a node is in several partitions). Grouped rows (`sinfo --json` without -N) are refused."""
    d = _record(doc, "document")
    if "nodes" in d and d["nodes"] is not None:
        nodes = d["nodes"]
        if not isinstance(nodes, list):
            raise _bad("nodes", nodes, "a list of node objects")
        return [dict(_record(n, "nodes[]")) for n in nodes]
    rows = d.get("sinfo")
    if rows is None:
        return []
    if not isinstance(rows, list):
        raise _bad("sinfo", rows, "a list of sinfo rows")
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        r = _record(row, "sinfo[]")
        names = _hosts(_record(r.get("nodes") or {}, "sinfo[].nodes").get("nodes"), "sinfo[].nodes.nodes")
        if len(names) > 1:  # its reason, features, GPUs and address are one node's: never copied onto the rest
            raise _bad("sinfo[].nodes.nodes", ",".join(names[:4]) + (",..." if len(names) > 4 else ""),
                       "one node per row: 23.02+ `sinfo --json` groups nodes that share a state, and the row "
                       "carries one node's reason and features; read nodes with `scontrol --json show nodes` "
                       "(or `sinfo -N --json`)")
        for host in names:
            out.setdefault(host, {**r, "name": host})
    return list(out.values())


def node_name(node: Any) -> str:
    """The node's name ("name"; a 23.02+ sinfo row's first entry of nodes.nodes), "" when absent."""
    n = _record(node, "node")
    if "name" in n:
        return _text(n["name"], "name")
    if _is_sinfo_entry(n):
        names = _hosts(n["nodes"].get("nodes"), "nodes.nodes")
        return names[0] if names else ""
    return ""


def node_state(node: Any) -> tuple[str, frozenset[str]]:
    """(base state lowercased, flags uppercased) from any version's spelling of a node's state."""
    n = _record(node, "node")
    if _is_sinfo_entry(n):
        raw: Any = n["node"].get("state")
        field = "node.state"
    else:
        raw = n.get("state")
        field = "state"
    words = [w.upper().rstrip("*~#!%$@^-") for w in _words(raw, field, ",+")]
    flags = {f.upper() for f in _words(n.get("state_flags"), "state_flags")}
    base: str | None = None
    implied: str | None = None
    for w in words:
        w = _NODE_BASE_ALIASES.get(w, w)
        if w in NODE_BASE_STATES:
            base = base or w
        elif w in _NODE_DERIVED:
            implied = implied or _NODE_DERIVED[w]
            flags.add("DRAIN")
        elif w:
            flags.add(w)
    return (base or implied or "UNKNOWN").lower(), frozenset(flags)


def node_reason(node: Any) -> str:
    """Why the node is drained/down ("" when none); 23.02+ sinfo rows nest it as reason.description."""
    n = _record(node, "node")
    r = n.get("reason")
    if isinstance(r, Mapping):
        return _text(r.get("description"), "reason.description")
    return _text(r, "reason")


def node_reason_user(node: Any) -> str | None:
    """Who set the reason (`reason_set_by_user`; reason.user in sinfo rows); None when nobody."""
    n = _record(node, "node")
    r = n.get("reason")
    if isinstance(r, Mapping):
        who = _text(r.get("user"), "reason.user")
    else:
        who = _text(n.get("reason_set_by_user"), "reason_set_by_user")
    return who or None


def _features(node: Any, key: str, sinfo_key: str) -> list[str]:
    n = _record(node, "node")
    f = n.get("features")
    if isinstance(f, Mapping) and ("total" in f or "active" in f):  # 23.02+ sinfo row
        return _words(f.get(sinfo_key), f"features.{sinfo_key}")
    return _words(n.get(key), key)


def node_features(node: Any) -> list[str]:
    """Available features: a comma string in 22.05, a list from 23.02 on."""
    return _features(node, "features", "total")


def node_active_features(node: Any) -> list[str]:
    """Active features: a comma string in 22.05, a list from 23.02 on."""
    return _features(node, "active_features", "active")


def node_address(node: Any) -> str | None:
    """NodeAddr ("address"; "node_addr"; else "hostname"; a sinfo row's nodes.addresses), or None."""
    n = _record(node, "node")
    for key in ("address", "node_addr", "hostname"):
        a = _text(n.get(key), key)
        if a:
            return a
    if _is_sinfo_entry(n):  # addresses run parallel to the row's names
        addrs = _words(n["nodes"].get("addresses"), "nodes.addresses")
        names = _hosts(n["nodes"].get("nodes"), "nodes.nodes")
        name = node_name(n)
        if len(addrs) == len(names) and name in names:
            return addrs[names.index(name)]
    return None


def gres_count(spec: Any, name: str = "gpu", *, field: str = "gres") -> int:
    """How many `name` a gres/TRES string holds: "gpu:h100:8(S:0-1)", "gres/gpu:8", "gres:gpu:4",
    "gpu:a100:4,gpu:h100:4" (8), "gpu" (1); other resources (shard, mps, tmpsize) are not counted."""
    if spec is None:
        return 0
    if not isinstance(spec, str):
        raise _bad(field, spec, "a gres string like 'gpu:h100:8'")
    if spec.strip().lower() in _EMPTY_GRES:
        return 0
    total = 0
    tres_untyped = tres_typed = 0
    saw_untyped = False
    for item in _split_top(spec):
        body = re.sub(r"\(.*\)$", "", item).strip()
        body = re.sub(r"^gres[/:]", "", body)  # TRES spellings: gres/gpu:8, 22.05's gres:gpu:8
        if "=" in body:  # TRES counts: gres/gpu=16 with its typed twin gres/gpu:h100=16
            key, _, val = body.partition("=")
            kname, _, ktype = key.partition(":")
            if kname == name and ktype:
                tres_typed += _count(val, field, spec)
            elif kname == name:
                tres_untyped += _count(val, field, spec)
                saw_untyped = True
            continue
        parts = body.split(":")
        if parts[0] != name:
            continue
        if len(parts) > 1 and re.fullmatch(r"\d+[KMGTPkmgtp]?", parts[-1]):
            total += _count(parts[-1], field, spec)
        else:
            total += 1  # "gpu" or "gpu:h100": no count means one
    return total + (tres_untyped if saw_untyped else tres_typed)


def gpus_per_node(node: Any) -> int:
    """GPUs the node has, from its configured gres (never assumed); 0 without GPU gres."""
    n = _record(node, "node")
    g = n.get("gres")
    if isinstance(g, Mapping):  # 23.02+ sinfo row: gres: {total, used}
        return gres_count(g.get("total"), field="gres.total")
    return gres_count(g, field="gres")


# ---- jobs --------------------------------------------------------------------------------------------

def _job_words(job: Any) -> list[str]:
    j = _record(job, "job")
    return [w.upper() for w in _words(j.get("job_state"), "job_state", ",+")]


def job_state(job: Any) -> str:
    """The job's base state, uppercased (PENDING, RUNNING, ...). When 22.05 gives only a flag, the
    base it implies (REQUEUED: PENDING, CONFIGURING: RUNNING); COMPLETING/STAGE_OUT hide the end
    state and give "COMPLETING". Missing: "UNKNOWN"."""
    words = _job_words(job)
    for w in words:
        if w in JOB_BASE_STATES:
            return w
    for w in words:
        if w in _JOB_FLAG_BASE:
            return _JOB_FLAG_BASE[w]
    return words[0] if words else "UNKNOWN"


def job_flags(job: Any) -> frozenset[str]:
    """The flags riding along with the job's base state (COMPLETING, REQUEUED, CONFIGURING...)."""
    return frozenset(w for w in _job_words(job) if w not in JOB_BASE_STATES)


def job_nodes(job: Any) -> str:
    """The hostlist expression of the job's nodes ("n[1-2]"), "" when it has none (pending)."""
    j = _record(job, "job")
    nodes = _text(j.get("nodes"), "nodes")
    if nodes.strip():
        return nodes.strip()
    res = j.get("job_resources")
    if res is None:
        return ""
    res = _record(res, "job_resources")
    rn = res.get("nodes")
    if isinstance(rn, Mapping):  # v0.0.41+: {count, select_type, list, whole, allocation}
        lst = _text(rn.get("list"), "job_resources.nodes.list")
        if lst.strip():
            return lst.strip()
        alloc = rn.get("allocation")
        names = _alloc_names(alloc, "job_resources.nodes.allocation", "name")
        return ",".join(names)
    text = _text(rn, "job_resources.nodes")
    if text.strip():
        return text.strip()
    return ",".join(_alloc_names(res.get("allocated_nodes"), "job_resources.allocated_nodes", "nodename"))


def _alloc_names(alloc: Any, field: str, key: str) -> list[str]:
    if alloc is None:
        return []
    if not isinstance(alloc, list):
        raise _bad(field, alloc, "a list of node allocations")
    names = []
    for a in alloc:
        name = _text(_record(a, field + "[]").get(key), f"{field}[].{key}")
        if name:
            names.append(name)
    return names


def job_node_count(job: Any) -> int:
    """How many nodes the job has (or asks for, while pending): node_count, plain or number object."""
    j = _record(job, "job")
    n = number(j.get("node_count"), None, field="node_count")
    if n is not None and not math.isinf(n):
        return int(n)
    nodes = job_nodes(j)
    return len(expand_hostlist(nodes)) if nodes else 0


def job_id(job: Any) -> str:
    """The job id as a string ("" when absent); an int in every version so far."""
    j = _record(job, "job")
    v = j.get("job_id")
    if v is None:
        return ""
    if isinstance(v, bool):
        raise _bad("job_id", v, "an integer or a string")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, Mapping):
        n = number(v, None, field="job_id")
        return "" if n is None or math.isinf(n) else str(int(n))
    if isinstance(v, str):
        return v.strip()
    raise _bad("job_id", v, "an integer or a string")


def job_comment(job: Any) -> str:
    """The job's own comment (`scontrol update comment=`): a string from squeue, or the "job" part
    of sacct/slurmdbd's {"administrator", "job", "system"}."""
    j = _record(job, "job")
    c = j.get("comment")
    if isinstance(c, Mapping):
        return _text(c.get("job"), "comment.job")
    return _text(c, "comment")


def job_gpus(job: Any, gpus_per_node_of: Mapping[str, int]) -> int:
    """GPUs the job holds: its allocated TRES (gres/gpu=16), else its request per node (tres_per_node
    "gres/gpu:8" or 22.05's "gres:gpu:8") times its node count, else per job (tres_per_job), else
    gres_detail summed over its nodes, else every GPU of the nodes it runs on."""
    j = _record(job, "job")
    alloc = _text(j.get("tres_alloc_str"), "tres_alloc_str")
    if re.search(r"(^|,)gres/gpu(:[^=,]*)?=", alloc):
        return gres_count(alloc, field="tres_alloc_str")
    per_node = _text(j.get("tres_per_node"), "tres_per_node")
    if gres_count(per_node, field="tres_per_node"):
        return gres_count(per_node, field="tres_per_node") * max(job_node_count(j), 1)
    per_job = _text(j.get("tres_per_job"), "tres_per_job")
    if gres_count(per_job, field="tres_per_job"):
        return gres_count(per_job, field="tres_per_job")
    detail = j.get("gres_detail")
    if detail is not None:
        total = sum(gres_count(d, field="gres_detail[]") for d in _words_list(detail, "gres_detail"))
        if total:
            return total
    nodes = job_nodes(j)
    return sum(int(gpus_per_node_of.get(h, 0)) for h in expand_hostlist(nodes)) if nodes else 0


def _words_list(v: Any, field: str) -> list[str]:
    """A list of strings kept whole (gres_detail entries contain commas inside parentheses)."""
    if isinstance(v, str):
        return [v] if v.strip() else []
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _bad(field, v, "a list of strings")
    return list(v)


def job_time(job: Any, key: str) -> float | None:
    """start_time / end_time (epoch s) or time_limit (minutes), plain or number objects. None when
    unset, including 0 for a time not yet known and 22.05's null (which is also how it writes an
    UNLIMITED time_limit); math.inf for an infinite limit."""
    j = _record(job, "job")
    v = number(j.get(key), None, field=key)
    if v is None:
        return None
    if key == "time_limit":
        if v == _INFINITE:
            return math.inf
        if v == _NO_VAL:
            return None
        return v
    return v if v > 0 else None
