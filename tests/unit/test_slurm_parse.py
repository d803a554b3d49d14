"""`railyard.backends.slurm.parse` on recorded Slurm JSON of every major version from 22.05 to 25.05.

The fixtures and where each came from are in tests/fixtures/slurm/SOURCES.md. Each version's case
names the nodes and jobs that play a role (idle, drained by an admin, draining under a running job,
GPU nodes, a running multi-node job, a pending job) and what reading them must give.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from railyard.backends.slurm import parse
from railyard.backends.slurm.commands import expand_hostlist

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


@dataclass(frozen=True)
class Case:
    version: str
    nodes_file: str
    data_parser: str  # what the fixture's meta says produced it
    idle: str
    idle_flags: frozenset[str]
    idle_features: list[str]
    admin: str
    admin_base: str
    admin_reason: str
    admin_user: str
    draining: str
    draining_base: str
    gpus: dict[str, int]
    address: tuple[str, str]
    running: str
    running_hosts: list[str]
    running_gpus: int
    running_time_limit: float
    pending: str
    pending_count: int
    pending_gpus: int
    comments: dict[str, str] = field(default_factory=dict)


CASES = [
    Case("22.05", "sinfo.json", "openapi/v0.0.38",
         idle="n1", idle_flags=frozenset(), idle_features=["h100", "ib"],
         admin="n2", admin_base="idle", admin_reason="admin: bad dimm", admin_user="root",
         draining="n4", draining_base="mixed",
         gpus={"n1": 8, "n2": 8, "n3": 8, "n4": 8, "n5": 8}, address=("n1", "127.0.0.1"),
         running="1", running_hosts=["n3", "n4"], running_gpus=16, running_time_limit=30,
         pending="2", pending_count=8, pending_gpus=64, comments={"1": "railyard_ckpt=1700000000.5", "2": ""}),
    Case("23.02", "nodes.json", "v0.0.39",
         idle="cn003", idle_flags=frozenset(), idle_features=["h100", "ib"],
         admin="cn051", admin_base="idle", admin_reason="ECC memory error", admin_user="root",
         draining="cn052", draining_base="allocated",
         gpus={"cn003": 0, "cn051": 0, "cn052": 8, "cn053": 8}, address=("cn051", "admin.emulator"),
         running="310", running_hosts=[f"cn{i:03d}" for i in range(52, 68)], running_gpus=16, running_time_limit=60,
         pending="52175550", pending_count=1, pending_gpus=0, comments={"310": ""}),
    Case("23.11", "nodes.json", "data_parser/v0.0.40",
         idle="cn1", idle_flags=frozenset(), idle_features=[],
         admin="cn2", admin_base="idle", admin_reason="admin: bad dimm", admin_user="admin",
         draining="cn975", draining_base="allocated",
         gpus={"cn1": 0, "cn2": 0, "cn975": 8, "cn976": 8}, address=("cn975", "cn975"),
         running="424855", running_hosts=[f"cn{i}" for i in range(975, 981)], running_gpus=16, running_time_limit=60,
         pending="671", pending_count=1, pending_gpus=0),
    Case("24.05", "nodes.json", "data_parser/v0.0.41",
         idle="cn001", idle_flags=frozenset({"COMPLETING", "PLANNED"}), idle_features=[],
         admin="cn002", admin_base="idle", admin_reason="admin: bad dimm", admin_user="admin",
         draining="cn975", draining_base="allocated",
         gpus={"cn001": 0, "cn002": 0, "cn975": 8, "cn976": 8}, address=("cn001", "admin.emulator"),
         running="424855", running_hosts=[f"cn{i}" for i in range(975, 981)], running_gpus=48, running_time_limit=60,
         pending="671", pending_count=1, pending_gpus=0),
    Case("24.11", "nodes.json", "data_parser/v0.0.42",
         idle="host1", idle_flags=frozenset(), idle_features=[],
         admin="cn2", admin_base="down", admin_reason="Power dead", admin_user="root",
         draining="cn3", draining_base="mixed",
         gpus={"host1": 2, "cn2": 0, "cn3": 8, "cn4": 8}, address=("host1", "localhost"),
         running="424855", running_hosts=["cn3", "cn4"], running_gpus=16, running_time_limit=60,
         pending="671", pending_count=4, pending_gpus=32),
    Case("25.05", "nodes.json", "data_parser/v0.0.43",
         idle="host1", idle_flags=frozenset(), idle_features=["h100", "ib"],
         admin="host2", admin_base="idle", admin_reason="admin: bad dimm", admin_user="admin",
         draining="cn3", draining_base="mixed",
         gpus={"host1": 2, "host2": 2, "cn3": 8, "cn4": 8}, address=("cn3", "cn3"),
         running="424855", running_hosts=["cn3", "cn4"], running_gpus=16, running_time_limit=60,
         pending="671", pending_count=4, pending_gpus=32,
         comments={"424855": "railyard_ckpt=1748000000.25", "671": ""}),
]


def load(version: str, name: str) -> dict[str, Any]:
    return json.loads((FIX / version / name).read_text())


def nodes_of(case: Case) -> dict[str, dict[str, Any]]:
    return {parse.node_name(n): n for n in parse.node_records(load(case.version, case.nodes_file))}


def jobs_of(case: Case) -> dict[str, dict[str, Any]]:
    return {parse.job_id(j): j for j in load(case.version, "squeue.json")["jobs"]}


def gpus_of(case: Case) -> dict[str, int]:
    return {name: parse.gpus_per_node(n) for name, n in nodes_of(case).items()}


ids = [c.version for c in CASES]


# ---- the fixtures really have each version's shapes ---------------------------------------------------

def test_every_version_has_fixtures_and_sources() -> None:
    assert sorted(p.name for p in FIX.iterdir() if p.is_dir()) == ids
    sources = (FIX / "SOURCES.md").read_text()
    for f in sorted(FIX.rglob("*.json")):
        assert str(f.relative_to(FIX)) in sources, f"{f} is not described in SOURCES.md"


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_fixture_meta_names_the_version(case: Case) -> None:
    for name in (case.nodes_file, "squeue.json"):
        meta = load(case.version, name)["meta"]
        plugin = meta.get("plugin") or meta.get("plugins") or {}
        version = case.data_parser.split("/")[-1]
        assert any(str(plugin.get(k, "")).endswith(version) for k in ("type", "data_parser")), name
        slurm = meta.get("Slurm") or meta.get("slurm")
        assert slurm["release"].startswith(case.version), slurm["release"]


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_fixture_field_shapes_are_the_versions(case: Case) -> None:
    """22.05: state a string + state_flags, features a comma string, plain numbers; 23.02: lists and
    number objects, job_state still a string; 23.11+: job_state a list; 24.05+: job_resources.nodes
    an object."""
    node = nodes_of(case)[case.admin]
    job = jobs_of(case)[case.running]
    old = case.version == "22.05"
    assert isinstance(node["state"], str) is old
    assert ("state_flags" in node) is old
    assert isinstance(node["features"], str) is old
    assert isinstance(job["node_count"], int) is old
    assert isinstance(job["job_state"], str) is (case.version in ("22.05", "23.02"))
    assert isinstance(job["job_resources"]["nodes"], dict) is (case.version >= "24.05")
    assert isinstance(job["start_time"], int) is (case.version in ("22.05", "23.02"))


# ---- nodes -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=ids)
def test_idle_node(case: Case) -> None:
    node = nodes_of(case)[case.idle]
    assert parse.node_state(node) == ("idle", case.idle_flags)
    assert parse.node_reason(node) == ""
    assert parse.node_reason_user(node) is None
    assert parse.node_features(node) == case.idle_features


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_node_drained_by_an_admin(case: Case) -> None:
    node = nodes_of(case)[case.admin]
    base, flags = parse.node_state(node)
    assert base == case.admin_base
    assert "DRAIN" in flags
    assert parse.node_reason(node) == case.admin_reason
    assert parse.node_reason_user(node) == case.admin_user


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_node_draining_under_a_running_job(case: Case) -> None:
    node = nodes_of(case)[case.draining]
    base, flags = parse.node_state(node)
    assert base == case.draining_base
    assert base in ("allocated", "mixed")
    assert "DRAIN" in flags
    assert parse.node_reason(node).startswith("railyard op=")
    assert case.draining in expand_hostlist(parse.job_nodes(jobs_of(case)[case.running]))


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_gpus_per_node_from_gres(case: Case) -> None:
    assert gpus_of(case) == case.gpus


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_node_address(case: Case) -> None:
    name, address = case.address
    assert parse.node_address(nodes_of(case)[name]) == address


# ---- jobs --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=ids)
def test_running_multi_node_job(case: Case) -> None:
    job = jobs_of(case)[case.running]
    assert parse.job_state(job) == "RUNNING"
    assert parse.job_flags(job) == frozenset()
    assert expand_hostlist(parse.job_nodes(job)) == case.running_hosts
    assert len(case.running_hosts) > 1
    assert parse.job_node_count(job) == len(case.running_hosts)
    assert parse.job_gpus(job, gpus_of(case)) == case.running_gpus
    assert parse.job_time(job, "time_limit") == case.running_time_limit
    start, end = parse.job_time(job, "start_time"), parse.job_time(job, "end_time")
    assert start is not None and end is not None and 1.6e9 < start < end


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_pending_job(case: Case) -> None:
    job = jobs_of(case)[case.pending]
    assert parse.job_state(job) == "PENDING"
    assert parse.job_nodes(job) == ""
    assert parse.job_node_count(job) == case.pending_count
    assert parse.job_gpus(job, gpus_of(case)) == case.pending_gpus  # what it asks for, if it asks for GPUs


@pytest.mark.parametrize("case", [c for c in CASES if c.comments], ids=[c.version for c in CASES if c.comments])
def test_job_comment(case: Case) -> None:
    jobs = jobs_of(case)
    assert {jid: parse.job_comment(jobs[jid]) for jid in case.comments} == case.comments


def test_22_05_unlimited_time_limit_is_null_and_a_job_without_gres_holds_its_nodes_gpus() -> None:
    case = CASES[0]
    job = jobs_of(case)["3"]
    assert job["time_limit"] is None  # what 22.05 writes for --time=UNLIMITED
    assert parse.job_time(job, "time_limit") is None
    assert parse.job_gpus(job, gpus_of(case)) == 8  # no gres request: every GPU of n5
    assert parse.job_time(jobs_of(case)["2"], "start_time") is None  # pending: 0


def test_25_05_cancelled_completing_job_and_infinite_limit() -> None:
    job = jobs_of(CASES[-1])["424857"]
    assert parse.job_state(job) == "CANCELLED"
    assert parse.job_flags(job) == frozenset({"COMPLETING"})
    assert parse.job_time(job, "time_limit") == math.inf
    assert parse.job_gpus(job, {}) == 8  # gres/gpu=8 in tres_alloc_str, typed duplicate not added


# ---- 23.02+ sinfo --json: rows under "sinfo", not "nodes" ---------------------------------------------

def test_23_02_sinfo_rows_are_read_as_nodes() -> None:
    doc = load("23.02", "sinfo.json")
    assert "nodes" not in doc  # a reader of doc["nodes"] sees nothing on 23.02+
    [node] = parse.node_records(doc)
    assert parse.node_name(node) == "localhost"
    assert parse.node_state(node) == ("allocated", frozenset())
    assert parse.node_reason(node) == ""
    assert parse.node_reason_user(node) is None
    assert parse.node_features(node) == []
    assert parse.gpus_per_node(node) == 0
    assert parse.node_address(node) is None


def test_sinfo_rows_of_one_node_each_first_partition_wins_and_grouped_rows_are_refused() -> None:
    """`sinfo -N --json` rows are one node each (a node in two partitions twice: the first wins). A grouped row
    (plain `sinfo --json` on 23.02+) carries one node's reason, features, GPUs for all: refused, never copied."""
    row = load("23.02", "sinfo.json")["sinfo"][0]
    drained = copy.deepcopy(row)
    drained["nodes"]["nodes"] = ["gpu01"]
    drained["node"]["state"] = ["IDLE", "DRAIN"]
    drained["reason"] = {"description": "admin: bad dimm", "time": 1727343318, "user": "admin"}
    drained["gres"] = {"total": "gpu:h100:8(S:0-1)", "used": "gpu:h100:0(IDX:N/A)"}
    drained["features"] = {"total": "h100,ib", "active": "h100"}
    drained["nodes"]["addresses"] = ["10.0.0.1"]
    other_partition = copy.deepcopy(drained)
    other_partition["node"]["state"] = ["MIXED"]
    recs = {parse.node_name(n): n for n in parse.node_records({"sinfo": [drained, other_partition, row]})}
    assert sorted(recs) == ["gpu01", "localhost"]
    g = recs["gpu01"]
    assert parse.node_state(g) == ("idle", frozenset({"DRAIN"}))
    assert parse.node_reason(g) == "admin: bad dimm" and parse.node_reason_user(g) == "admin"
    assert parse.gpus_per_node(g) == 8
    assert parse.node_features(g) == ["h100", "ib"] and parse.node_active_features(g) == ["h100"]
    assert parse.node_address(g) == "10.0.0.1"
    grouped = copy.deepcopy(drained)
    grouped["nodes"]["nodes"] = ["gpu[01,03]", "gpu05"]
    with pytest.raises(ValueError, match="one node per row"):
        parse.node_records({"sinfo": [grouped]})


REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "slurm"


def test_a_real_24_11_sinfo_document_groups_nodes_and_is_refused() -> None:
    """Recorded from a 24.11.6 cluster (tests/fixtures/real/slurm/SOURCES.md): rows of many nodes, one
    reason each. Read per node, an admin's drain could read as Railyard's and the reverse."""
    doc = json.loads((REAL / "24.11-sinfo.json").read_text())
    grouped = [r for r in doc["sinfo"] if len(parse._hosts(r["nodes"]["nodes"], "nodes")) > 1]
    assert grouped
    with pytest.raises(ValueError, match="one node per row"):
        parse.node_records(doc)


def test_a_real_25_11_scontrol_show_node_document_is_read_per_node() -> None:
    doc = json.loads((REAL / "25.11-scontrol-show-node.json").read_text())
    recs = parse.node_records(doc)
    assert len(recs) == len(doc["nodes"]) >= 1
    for raw, rec in zip(doc["nodes"], recs, strict=True):
        assert parse.node_name(rec) == raw["name"]
        assert parse.node_reason(rec) == (raw.get("reason") or "")
        parse.node_state(rec)  # every node's own state reads


def test_the_live_22_05_documents_read_per_node_with_the_admins_drain_as_the_admins() -> None:
    """What the fleet's reads printed on the test cluster (recorded by test_slurm_fleet.py's live check):
    an admin's drain with its reason, two nodes mixed under a running job, the job on them."""
    sinfo = json.loads((REAL / "22.05-sinfo-live.json").read_text())
    recs = {parse.node_name(r): r for r in parse.node_records(sinfo)}
    assert sorted(recs) == [f"n{i}" for i in range(1, 9)]
    assert parse.node_state(recs["n2"]) == ("idle", frozenset({"DRAIN"}))
    assert parse.node_reason(recs["n2"]) == "admin: bad dimm" and parse.node_reason_user(recs["n2"]) == "root"
    assert all(parse.gpus_per_node(r) == 0 for r in recs.values())  # the test cluster declares no GRES
    (job,) = json.loads((REAL / "22.05-squeue-live.json").read_text())["jobs"]
    assert parse.job_state(job) == "RUNNING" and parse.job_node_count(job) == 2
    assert {parse.node_state(recs[n])[0] for n in ("n3", "n4")} == {"mixed"}


def test_node_records_of_other_documents() -> None:
    assert parse.node_records({"meta": {}, "errors": []}) == []
    assert ([parse.node_name(n) for n in parse.node_records(load("22.05", "sinfo.json"))]
            == ["n1", "n2", "n3", "n4", "n5"])
    with pytest.raises(ValueError, match="'nodes'"):
        parse.node_records({"nodes": {"n1": {}}})
    with pytest.raises(ValueError, match="'document'"):
        parse.node_records(["n1"])


# ---- the forms, one by one ----------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "default", "expected"), [
    (7, None, 7.0),
    (2.5, None, 2.5),
    (None, None, None),
    (None, 3.0, 3.0),
    ({"set": True, "infinite": False, "number": 60}, None, 60.0),
    ({"set": False, "infinite": False, "number": 0}, None, None),
    ({"set": False, "infinite": False, "number": 0}, -1.0, -1.0),
    ({"set": False, "infinite": True, "number": 0}, None, math.inf),
    ({"set": True, "infinite": True, "number": 5}, None, math.inf),
    ({"set": True, "infinite": False, "number": 1.5}, None, 1.5),
])
def test_number_forms(value: Any, default: float | None, expected: float | None) -> None:
    assert parse.number(value, default) == expected


@pytest.mark.parametrize("value", [True, "60", [60], {"set": "yes", "number": 1}, {"set": True, "number": "1"}])
def test_number_bad_types(value: Any) -> None:
    with pytest.raises(ValueError, match=r"'time_limit'.*got"):
        parse.number(value, field="time_limit")


@pytest.mark.parametrize(("node", "expected"), [
    ({"state": "idle", "state_flags": ["DRAIN"]}, ("idle", frozenset({"DRAIN"}))),
    ({"state": "down", "state_flags": ["DRAIN", "NOT_RESPONDING"]}, ("down", frozenset({"DRAIN", "NOT_RESPONDING"}))),
    ({"state": ["IDLE", "DRAIN"]}, ("idle", frozenset({"DRAIN"}))),
    ({"state": ["DRAIN", "MIXED"]}, ("mixed", frozenset({"DRAIN"}))),
    ({"state": ["IDLE", "POWERED_DOWN", "DYNAMIC_NORM"]}, ("idle", frozenset({"POWERED_DOWN", "DYNAMIC_NORM"}))),
    ({"state": "IDLE+DRAIN"}, ("idle", frozenset({"DRAIN"}))),
    ({"state": "mixed+drain"}, ("mixed", frozenset({"DRAIN"}))),
    ({"state": "ALLOCATED+DRAIN+COMPLETING"}, ("allocated", frozenset({"DRAIN", "COMPLETING"}))),
    ({"state": "drained"}, ("idle", frozenset({"DRAIN"}))),
    ({"state": "draining"}, ("allocated", frozenset({"DRAIN"}))),
    ({"state": "mix"}, ("mixed", frozenset())),
    ({"state": "down*"}, ("down", frozenset())),
    ({"state": ["FUTURE"]}, ("future", frozenset())),
    ({"state": ["DRAIN"]}, ("unknown", frozenset({"DRAIN"}))),
    ({}, ("unknown", frozenset())),
    ({"state": None, "state_flags": None}, ("unknown", frozenset())),
])
def test_node_state_forms(node: dict[str, Any], expected: tuple[str, frozenset[str]]) -> None:
    assert parse.node_state(node) == expected


@pytest.mark.parametrize(("gres", "expected"), [
    ("gpu:8", 8), ("gpu:h100:8", 8), ("gpu:h100:8(S:0-1)", 8), ("gpu:a100:4,gpu:h100:4", 8),
    ("gpu:4,shard:16", 4), ("", 0), ("(null)", 0), (None, 0), ("N/A", 0), ("gpu", 1), ("gpu:h100", 1),
    ("tmpsize:7T,gpu:l40s:4(S:0-1)", 4), ("gpu:4(S:0,2),mps:200", 4), ("mps:400,shard:8", 0),
    ("gpu:fake1:1(S:0),gpu:fake2:1(S:0)", 2), ("gpu:1g.10gb:7", 7),
])
def test_gpus_per_node_forms(gres: Any, expected: int) -> None:
    assert parse.gpus_per_node({"name": "x", "gres": gres}) == expected


def test_gres_count_of_tres_spellings() -> None:
    assert parse.gres_count("gres/gpu:8") == 8
    assert parse.gres_count("gres:gpu:8") == 8  # 22.05's tres_per_node
    assert parse.gres_count("gres/gpu:h100:2,gres/shard:4") == 2
    assert parse.gres_count("gres/gpu=16") == 16
    assert parse.gres_count("gres/shard:4", "shard") == 4


@pytest.mark.parametrize(("state", "base", "flags"), [
    ("RUNNING", "RUNNING", set()),
    (["RUNNING"], "RUNNING", set()),
    (["PENDING", "REQUEUED"], "PENDING", {"REQUEUED"}),
    (["COMPLETING", "CANCELLED"], "CANCELLED", {"COMPLETING"}),
    (["running", "configuring"], "RUNNING", {"CONFIGURING"}),
    ("REQUEUED", "PENDING", {"REQUEUED"}),          # 22.05: a set flag replaces the base state
    ("CONFIGURING", "RUNNING", {"CONFIGURING"}),
    ("COMPLETING", "COMPLETING", {"COMPLETING"}),    # the end state is not knowable
    ("OUT_OF_MEMORY", "OUT_OF_MEMORY", set()),
    (None, "UNKNOWN", set()),
])
def test_job_state_forms(state: Any, base: str, flags: set[str]) -> None:
    job = {"job_id": 1, "job_state": state}
    assert parse.job_state(job) == base
    assert parse.job_flags(job) == frozenset(flags)


@pytest.mark.parametrize(("comment", "expected"), [
    ("railyard_ckpt=17.5", "railyard_ckpt=17.5"),
    ({"administrator": "ops note", "job": "railyard_ckpt=17.5", "system": None}, "railyard_ckpt=17.5"),
    ({"administrator": None, "job": None, "system": None}, ""),
    (None, ""),
])
def test_job_comment_forms(comment: Any, expected: str) -> None:
    assert parse.job_comment({"comment": comment}) == expected


def test_job_nodes_from_job_resources_in_each_shape() -> None:
    v41 = copy.deepcopy(jobs_of(CASES[3])["424855"])
    del v41["nodes"]
    assert parse.job_nodes(v41) == "cn[975-980]"
    v41["job_resources"]["nodes"]["list"] = ""
    assert parse.job_nodes(v41) == "cn975,cn976"  # the (trimmed) allocation list
    v40 = copy.deepcopy(jobs_of(CASES[2])["424855"])
    v40["nodes"] = ""
    assert parse.job_nodes(v40) == "cn[975-980]"
    v40["job_resources"]["nodes"] = ""
    assert parse.job_nodes(v40) == "cn975,cn976"
    assert parse.job_nodes({"job_id": 1}) == ""
    assert parse.job_node_count({"job_id": 1, "nodes": "a[1-3]"}) == 3
    assert parse.job_node_count({"job_id": 1}) == 0


def test_job_gpus_in_order_of_evidence() -> None:
    of = {"a1": 4, "a2": 4}
    base = {"job_id": 1, "nodes": "a[1-2]", "node_count": 2}
    assert parse.job_gpus(base | {"tres_alloc_str": "cpu=8,node=2,gres/gpu:h100=6"}, of) == 6
    assert parse.job_gpus(base | {"tres_alloc_str": "cpu=8,gres/gpu=5,gres/gpu:h100=5"}, of) == 5
    assert parse.job_gpus(base | {"tres_per_node": "gres/gpu:3"}, of) == 6
    assert parse.job_gpus(base | {"tres_per_job": "gres/gpu:7"}, of) == 7
    assert parse.job_gpus(base | {"gres_detail": ["gpu:h100:2(IDX:0-1)", "gpu:h100:1(IDX:3)"]}, of) == 3
    assert parse.job_gpus(base, of) == 8
    assert parse.job_gpus(base | {"nodes": ""}, of) == 0


def test_job_time_sentinels_and_forms() -> None:
    assert parse.job_time({"time_limit": 4294967295}, "time_limit") == math.inf
    assert parse.job_time({"time_limit": 4294967294}, "time_limit") is None
    assert parse.job_time({"time_limit": {"set": False, "infinite": True, "number": 0}}, "time_limit") == math.inf
    assert parse.job_time({"start_time": {"set": True, "infinite": False, "number": 0}}, "start_time") is None
    assert parse.job_time({"end_time": 1727362133}, "end_time") == 1727362133.0
    assert parse.job_time({}, "start_time") is None


@pytest.mark.parametrize(("call", "arg", "field"), [
    (parse.node_state, {"state": 5}, "state"),
    (parse.node_state, {"state": ["IDLE", 3]}, "state"),
    (parse.node_state, {"state": "idle", "state_flags": "DRAIN"}, None),  # a string of flags is accepted
    (parse.node_reason, {"reason": ["bad"]}, "reason"),
    (parse.node_reason_user, {"reason": "x", "reason_set_by_user": 0}, "reason_set_by_user"),
    (parse.node_features, {"features": 3}, "features"),
    (parse.node_active_features, {"active_features": {"x": 1}}, "active_features"),
    (parse.node_address, {"address": ["10.0.0.1"]}, "address"),
    (parse.gpus_per_node, {"gres": 8}, "gres"),
    (parse.gpus_per_node, {"gres": "gpu:eight:x8"}, None),  # a type with no count: one
    (parse.gpus_per_node, "n1", "node"),
    (parse.job_state, {"job_state": 1}, "job_state"),
    (parse.job_id, {"job_id": True}, "job_id"),
    (parse.job_id, {"job_id": [1]}, "job_id"),
    (parse.job_comment, {"comment": 3}, "comment"),
    (parse.job_nodes, {"nodes": 3}, "nodes"),
    (parse.job_nodes, {"nodes": "", "job_resources": "n1"}, "job_resources"),
    (parse.job_node_count, {"node_count": "2"}, "node_count"),
    (parse.job_comment, None, "job"),
])
def test_bad_types_raise_value_error_naming_the_field(call: Any, arg: Any, field: str | None) -> None:
    if field is None:
        call(arg)  # tolerated forms: no exception
        return
    with pytest.raises(ValueError) as err:
        call(arg)
    assert f"'{field}'" in str(err.value)
    assert "got" in str(err.value)


def test_job_gpus_and_time_bad_types() -> None:
    with pytest.raises(ValueError, match="'tres_alloc_str'.*5"):
        parse.job_gpus({"tres_alloc_str": 5}, {})
    with pytest.raises(ValueError, match="'gres_detail'"):
        parse.job_gpus({"gres_detail": [1, 2]}, {})
    with pytest.raises(ValueError, match="'tres_alloc_str'"):
        parse.job_gpus({"tres_alloc_str": "gres/gpu=many"}, {})
    with pytest.raises(ValueError, match="'start_time'.*'soon'"):
        parse.job_time({"start_time": "soon"}, "start_time")


def test_job_id_forms() -> None:
    assert parse.job_id({"job_id": 310}) == "310"
    assert parse.job_id({"job_id": "310"}) == "310"
    assert parse.job_id({"job_id": {"set": True, "infinite": False, "number": 7}}) == "7"
    assert parse.job_id({}) == ""


def test_gres_count_of_tres_counts_does_not_add_the_typed_twin() -> None:
    assert parse.gres_count("cpu=8,mem=4G,gres/gpu=16,gres/gpu:h100=16,gres/tmpsize=10737418240") == 16
    assert parse.gres_count("cpu=8,gres/gpu:a100=2,gres/gpu:h100=4") == 6
    assert parse.gres_count("cpu=8,node=2,billing=8") == 0


# ---- the Slurm fleet itself reads every version: what a node and a job become ---------------------------

class FixtureCli:
    """Answers the fleet's reads with a version's recorded output; records any write (there must be none)."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.writes: list[tuple[str, ...]] = []
        self.reads: list[tuple[str, ...]] = []

    def run(self, *argv: str, retry: bool = True) -> str:
        from railyard.backends.slurm.commands import is_write

        if not is_write(argv):
            self.reads.append(argv)
        if is_write(argv):
            self.writes.append(argv)
            return ""
        if argv[:2] == ("scontrol", "--version"):
            return f"slurm {self.case.version}.1\n"
        if argv[:4] == ("scontrol", "--json", "show", "nodes"):  # what 23.02+ reads nodes with: per node
            return (FIX / self.case.version / "nodes.json").read_text()
        if argv[0] == "sinfo":  # what `sinfo --json` prints on this version (23.02+: grouped rows)
            return (FIX / self.case.version / "sinfo.json").read_text()
        if argv[0] == "squeue":
            return (FIX / self.case.version / "squeue.json").read_text()
        return ""  # scontrol show reservation: none


class NoRunner:
    """Versions unknown (no host answers here); the fleet's reads must not need more."""

    def versions(self, host: str) -> dict[str, str]:
        return {}


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_the_slurm_fleet_reads_every_version(case: Case, tmp_path: Path) -> None:
    from railyard.backends.slurm.fleet import SlurmFleet
    from railyard.domain.config import parse_config
    from railyard.domain.models import HostState

    names = [case.idle, case.admin, case.draining]
    cfg = parse_config({
        "components": [{"name": "gpu-driver"}],
        "releases": [{"id": "d", "component": "gpu-driver", "version": "570.86.15"}],
        "domains": [{"name": f"d{i}", "hosts": [n]} for i, n in enumerate(names)],
        "trains": [{"id": "t", "releases": ["d"]}],
        "buffers": {"maintenance": {"hosts": 1}, "failure": {"hosts": 3}},
        "fleet": {"backend": "slurm", "slurm": {"runner": "standin"}},
    })
    assert cfg.fleet.slurm is not None
    cli = FixtureCli(case)
    from railyard.ledger.state import Store

    store = Store(f"sqlite:///{tmp_path}/state.db")
    fleet = SlurmFleet(cfg, cfg.fleet.slurm, NoRunner(), store=store, cli=cli)  # type: ignore[arg-type]
    hosts = {h.name: h for h in fleet.hosts()}
    assert hosts[case.idle].state == HostState.SERVING, hosts[case.idle]
    # drained or downed by an admin: failed with their reason, never Railyard's to resume
    assert hosts[case.admin].state == HostState.FAILED and case.admin_reason in (hosts[case.admin].reason or "")
    # Railyard's own drain ("railyard op=..."), its job still running: draining, with its GPUs from gres
    assert hosts[case.draining].state == HostState.DRAINING, hosts[case.draining]
    assert hosts[case.draining].gpus == case.gpus[case.draining]
    jobs = {j.id: j for j in fleet.jobs()}
    run = jobs[case.running]
    assert run.state == "running" and run.hosts == case.running_hosts and run.gpus == case.running_gpus
    ckpt = case.comments.get(case.running, "")
    assert run.last_checkpoint == (float(ckpt.split("=")[1]) if ckpt else 0.0)
    assert jobs[case.pending].state == "pending" and jobs[case.pending].hosts == []
    assert fleet.capacity().serving_hosts == 1
    assert cli.writes == []  # reads never write


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_reads_of_some_nodes_name_them_where_the_version_honours_it(case: Case, tmp_path: Path) -> None:
    """Nodes by hostlist from 23.02 (`scontrol --json show nodes`), jobs by hostlist from 24.05.1 (`squeue --json`
    honours filters from there on); before, the whole document, filtered here. The answers are the same."""
    from railyard.backends.slurm.commands import compress_hostlist
    from railyard.backends.slurm.fleet import SlurmFleet
    from railyard.domain.config import parse_config
    from railyard.ledger.state import Store

    names = [case.idle, case.admin, case.draining, *case.running_hosts]
    cfg = parse_config({
        "components": [{"name": "gpu-driver"}],
        "releases": [{"id": "d", "component": "gpu-driver", "version": "570.86.15"}],
        "domains": [{"name": "d", "hosts": sorted(set(names))}],
        "trains": [{"id": "t", "releases": ["d"]}],
        "buffers": {"maintenance": {"hosts": len(set(names))}, "failure": {"hosts": 3}},
        "fleet": {"backend": "slurm", "slurm": {"runner": "standin"}},
    })
    assert cfg.fleet.slurm is not None
    cli = FixtureCli(case)
    fleet = SlurmFleet(cfg, cfg.fleet.slurm, NoRunner(), store=Store(f"sqlite:///{tmp_path}/s.db"),  # type: ignore[arg-type]
                       cli=cli)
    asked = [case.idle, case.draining]
    got = {h.name: h.state.value for h in fleet.hosts(asked)}
    jobs = {j.id for j in fleet.jobs([case.draining])}
    assert set(got) == set(asked) and case.running in jobs and case.pending not in jobs
    reads = [r for r in cli.reads if r[:2] != ("scontrol", "--version")]
    major, minor = (int(x) for x in case.version.split("."))
    if (major, minor) >= (23, 2):
        assert reads[0] == ("scontrol", "--json", "show", "nodes", compress_hostlist(asked)), reads
    else:
        assert reads[0] == ("sinfo", "--json"), reads
    if (major, minor) >= (24, 5):  # the fixture CLI says "<version>.1"
        assert reads[1] == ("squeue", "--json", f"--nodelist={case.draining}"), reads
    else:
        assert reads[1] == ("squeue", "--json"), reads
    assert cli.writes == []
