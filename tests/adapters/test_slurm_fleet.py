"""The Slurm backend against a real Slurm cluster started by the test (munged, slurmctld, 8 slurmd,
slurmrestd), with real batch jobs that checkpoint when signalled."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from railyard.backends.slurm.commands import SlurmCli, check_arg, expand_hostlist
from railyard.backends.slurm.fleet import SlurmFleet, fleet_from_config
from railyard.backends.slurm.standin import op_token
from railyard.domain.config import parse_config
from railyard.domain.models import HostState, Step
from railyard.fleet.port import FleetError
from railyard.ledger import Ledger
from tests.support.slurm_cluster import SlurmCluster, job_log, reset, running_cluster, slurm_config, submit
from tests.support.slurm_train import Sampler, parse_slurm_time, run_stop, run_train

TARGETS = {"gpu-driver": "570.86.15", "kernel": "6.1.0-28"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from running_cluster()


@pytest.fixture
def world(cluster: SlurmCluster, tmp_path: Path):
    reset(cluster)

    def make(**kw):
        cfg = parse_config(slurm_config(cluster, tmp_path / "state", **kw))
        return cfg, fleet_from_config(cfg), Ledger(f"sqlite:///{tmp_path}/state/ledger.db")

    return make


def test_the_cluster_is_real_and_slurmrestd_answers(cluster: SlurmCluster):
    data = json.loads(cluster.cli("sinfo", "--json").stdout)
    assert sorted(n["name"] for n in data["nodes"]) == [f"n{i}" for i in range(1, 9)]
    r = requests.get(f"{cluster.rest_url}/slurm/v0.0.38/nodes", headers=cluster.rest_headers, timeout=10)
    assert r.status_code == 200 and len(r.json()["nodes"]) == 8


def test_bad_input_is_refused_before_slurm_is_called(world):
    cfg, fleet, _ = world()
    with pytest.raises(ValueError):
        fleet.drain(["n1; reboot"], "t/r/rack-a")
    with pytest.raises(FleetError):
        fleet.hosts(["gpu-zz9"])  # not in any domain
    with pytest.raises(FleetError):
        check_arg("reason=$(reboot)")
    with pytest.raises(FleetError):
        fleet.request_checkpoint(["12 && scancel -u root"])
    assert expand_hostlist("n[1-3,05],m7") == ["n1", "n2", "n3", "n05", "m7"]
    assert op_token("demo/manual__2026-01-01T00:00:00+00:00/rack-a").startswith(
        "demo_manual__2026-01-01T00_00_00_00_00")


def test_a_train_with_running_jobs(world, cluster: SlurmCluster):
    """Every node upgraded and returned, one domain out at most, every job checkpointed before its node
    was taken and finished or requeued; a job submitted mid-train never starts in a reservation."""
    cfg, fleet, ledger = world()
    jobs = [submit(cluster, nodes=2, steps=400) for _ in range(3)]
    cluster._wait("jobs running", lambda: all(job_log(cluster, j) for j in jobs), timeout=30)
    late: list[str] = []

    with Sampler(cluster) as sampler:
        train = cfg.train("slurm")
        from railyard.operations.stop import Stop, op_id_for

        for i, domain in enumerate(cfg.train_domains(train)):
            s = Stop(config=cfg, train=train, domain=domain, op_id=op_id_for("slurm", "run1", domain.name),
                     fleet=fleet, ledger=ledger)
            run_stop(s)
            if i == 0:  # between stops: the next domain is reserved; a long job must not land there
                late.append(submit(cluster, nodes=2, steps=50, minutes=30))
        sampler.sample()

    hosts = fleet.hosts()
    assert all(h.state == HostState.SERVING and h.versions == TARGETS for h in hosts), hosts
    assert ledger.holdings() == {}
    assert sampler.max_domains_out(cfg.host_domain()) == 1
    nodes = json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"]
    assert not [(n["name"], n["state_flags"]) for n in nodes if {"DRAIN", "MAINTENANCE"} & set(n["state_flags"])]
    assert fleet.reservations() == {}  # each stop removed its own on return
    assert all("gpu-driver=570.86.15" in n["active_features"].split(",") for n in nodes)
    # the versions are usable by jobs: --constraint on the new driver is satisfiable
    test = cluster.cli("sbatch", "--test-only", "--constraint=gpu-driver=570.86.15", "--wrap", "true")
    assert "to start at" in test.stderr

    requeued = 0
    for j in jobs:
        log = job_log(cluster, j)
        # each run of the job that Slurm ended (term) had a checkpoint after its start, before the end
        run: list[list[str]] = []
        for line in log:
            if line[0] == "start":
                run = [line]
            else:
                run.append(line)
            if line[0] == "term":
                requeued += 1
                assert any(x[0] == "ckpt" for x in run), (j, log)
        state = sampler.jobs[j]["state"]
        assert (state in ("COMPLETED", "PENDING", "RUNNING")
                and (state != "PENDING" or sampler.jobs[j]["restart_cnt"] >= 1)), (j, state, log)
    assert requeued >= 3  # the jobs were really on the drained nodes and were moved off

    # the job submitted after the first stop never started on a reserved node inside its window
    # (reservations made while it was pending count: each later domain is reserved ahead of its stop)
    # that still existed when it started (a returned domain's reservation is deleted: the fleet notes
    # when; Slurm's start_time is whole seconds, so a start in the second of the deletion is not one)
    deleted = {n["name"]: n["at"] for n in fleet.notes("unreserve")}
    reserved = [(r["seen"], deleted.get(r["ReservationName"], r["last"]), parse_slurm_time(r["StartTime"]),
                 parse_slurm_time(r["EndTime"]), set(expand_hostlist(r["Nodes"])))
                for r in sampler.reservations.values()]
    assert len({r["ReservationName"] for r in sampler.reservations.values()}) == 4
    assert sampler.job_nodes(late[0]), "the late job never ran"
    for start, nodes_, limit in sampler.job_nodes(late[0]):
        for seen, last, r_start, r_end, r_nodes in reserved:
            overlaps = seen <= start and start + 1 <= last and start < r_end and start + limit * 60 > r_start
            assert not (overlaps and r_nodes & set(nodes_)), (late[0], start, nodes_, r_start, r_end, r_nodes)


def test_someone_elses_drain_is_left_alone_and_reported(world, cluster: SlurmCluster, caplog):
    cfg, fleet, ledger = world(trains=[{"id": "slurm", "releases": ["driver-570", "kernel-28"],
                                        "domains": ["rack-a", "rack-b"]}])
    cluster.cli("scontrol", "update", "nodename=n3", "state=drain", "reason=NHC: ECC errors on GPU 3")
    with Sampler(cluster) as sampler:
        results = run_train(cfg, fleet, ledger, "slurm")
    assert results["rack-b"]["return"]["returned"] == 1, results
    node = next(n for n in json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"] if n["name"] == "n3")
    assert "DRAIN" in node["state_flags"] and node["reason"] == "NHC: ECC errors on GPU 3"
    n3 = fleet.hosts(["n3"])[0]
    assert n3.state == HostState.FAILED and "NHC: ECC errors" in (n3.reason or "")
    assert n3.versions == {"gpu-driver": "550.127.08", "kernel": "6.1.0-25"}  # never upgraded
    assert fleet.hosts(["n4"])[0].versions == TARGETS
    # reported by the run: its log, and the host's state with their reason
    assert any("n3" in r.getMessage() and "not Railyard" in r.getMessage() for r in caplog.records)
    # every other node of the two domains was drained by Railyard and is back
    assert sampler.ever_drained() >= {"n1", "n2", "n4"}
    with pytest.raises(FleetError):
        fleet.upgrade("n3", [Step(component="kernel", version="6.1.0-28")], "slurm/run1/rack-b")


def test_health_gate_keeps_a_node_out_that_slurm_resumed_by_itself(world, cluster: SlurmCluster):
    cfg, fleet, ledger = world()
    from railyard.operations.stop import Stop

    train = cfg.train("slurm")
    s = Stop(config=cfg, train=train, domain=cfg.domain("rack-c"), op_id="slurm/gate/rack-c", fleet=fleet,
             ledger=ledger)
    assert s.take().granted
    s.drain()
    # what Slurm does after `scontrol reboot` when the drain reason is unchanged: it resumes the node
    cluster.cli("scontrol", "update", "nodename=n5", "state=resume")
    h = fleet.hosts(["n5"])[0]
    assert h.state == HostState.DRAINED and h.operation == "slurm/gate/rack-c", h
    before = len(fleet.cli.writes)
    fleet.hosts()
    fleet.jobs()
    assert len(fleet.cli.writes) == before  # a read never writes, not even the gate
    assert "DRAIN" not in next(n for n in json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"]
                               if n["name"] == "n5")["state_flags"]
    fleet.enforce_gate()  # what every write step of the stop does first
    node = next(n for n in json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"] if n["name"] == "n5")
    assert "DRAIN" in node["state_flags"] and node["reason"] == fleet.reason_for("slurm/gate/rack-c")
    assert [n["node"] for n in fleet.notes("gate_redrain")] == ["n5"]
    s.upgrade()
    s.check()
    assert s.return_hosts()["returned"] == 2
    # a controller restarted from state saved before the return brings back the drain and the
    # reservation: the next read gives both back again (seen when slurmctld is SIGKILLed)
    cluster.cli("scontrol", "update", "nodename=n5,n6", "state=drain",
                f"reason={fleet.reason_for('slurm/gate/rack-c')}")
    cluster.cli("scontrol", "create", "reservation", "reservationname=railyard_rack-c", "starttime=now",
                "duration=1", "nodes=n5,n6", "flags=maint,ignore_jobs", "users=root")
    fleet.enforce_gate()  # the next write step of any stop gives both back again
    assert all(h.state == HostState.SERVING for h in fleet.hosts(["n5", "n6"]))
    assert "railyard_rack-c" not in fleet.reservations()  # (rack-d's, made ahead, waits for its stop)
    assert sorted(n["node"] for n in fleet.notes("resume_replayed")) == ["n5", "n6"]


def test_a_node_an_admin_drained_mid_stop_is_never_drained_again_by_the_dead_stop(world, cluster: SlurmCluster):
    """NHC or an admin drains a node Railyard holds: it reads failed, the stop lets it go with its lease, and
    once its owner resumes it the gate leaves it serving; the domain's next stop takes it like any other."""
    cfg, fleet, ledger = world()
    from railyard.operations.stop import Stop

    train = cfg.train("slurm")
    s = Stop(config=cfg, train=train, domain=cfg.domain("rack-c"), op_id="slurm/run1/rack-c", fleet=fleet,
             ledger=ledger)
    assert s.take().granted
    s.drain()
    cluster.cli("scontrol", "update", "nodename=n5", "state=drain", "reason=NHC: GPU 2 fell off the bus")
    assert fleet.hosts(["n5"])[0].state == HostState.FAILED
    s.upgrade()
    s.check()
    assert s.return_hosts()["returned"] == 1
    assert not ledger.holdings("slurm/run1/rack-c")
    cluster.cli("scontrol", "update", "nodename=n5", "state=resume")  # the admin is done with it
    fleet.enforce_gate()
    node = next(n for n in json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"] if n["name"] == "n5")
    assert "DRAIN" not in node["state_flags"], node  # not drained again under the dead stop's reason
    assert fleet.hosts(["n5"])[0].state == HostState.SERVING
    assert [n["node"] for n in fleet.notes("gate_redrain")] == []
    s2 = Stop(config=cfg, train=train, domain=cfg.domain("rack-c"), op_id="slurm/run2/rack-c", fleet=fleet,
              ledger=ledger)
    assert s2.take().granted
    s2.drain()
    s2.upgrade()
    s2.check()
    assert s2.return_hosts()["returned"] == 2


def test_a_node_in_repair_comes_back_through_the_gate_once_marked_repaired(world, cluster: SlurmCluster):
    """`railyard host repaired n5`: Railyard's repair drain stays, under the repair operation's own reason;
    the repair gate then upgrades, checks and resumes it. Never resumed by the mark itself."""
    cfg, fleet, ledger = world()
    from railyard.operations.ops import mark_repaired
    from railyard.operations.repair import gate_repaired
    from railyard.operations.stop import Stop

    s = Stop(config=cfg, train=cfg.train("slurm"), domain=cfg.domain("rack-c"), op_id="slurm/run1/rack-c",
             fleet=fleet, ledger=ledger)
    assert s.take().granted
    s.drain()
    s.upgrade()
    s.offboard("n5", "health check failed: XID 79 (a test)")
    s.check()
    s.return_hosts()
    assert fleet.hosts(["n5"])[0].state == HostState.REPAIR
    out = mark_repaired(cfg, fleet, ledger, "n5", reason="replaced the GPU baseboard", actor="tech")
    n5 = fleet.hosts(["n5"])[0]
    assert n5.state == HostState.DRAINED and n5.operation == out["op"], n5  # still out: the gate decides
    got = gate_repaired(cfg, fleet, ledger, say=lambda m: None)
    assert got["returned"] == ["n5"] and got["errors"] == {}, got
    assert fleet.hosts(["n5"])[0].state == HostState.SERVING


def test_the_readers_fleet_reads_slurm_and_the_verified_features_and_reaches_no_host(world, cluster: SlurmCluster):
    """What the page, plan and drift use: node states from Slurm, versions from the features a passing
    check published on return; no host is reached (its runner does not exist) and nothing is written."""
    cfg, fleet, ledger = world()
    from railyard.backends.slurm.fleet import SlurmFleet
    from railyard.operations.stop import Stop

    s = Stop(config=cfg, train=cfg.train("slurm"), domain=cfg.domain("rack-c"), op_id="slurm/run1/rack-c",
             fleet=fleet, ledger=ledger)
    assert s.take().granted
    s.drain()
    s.upgrade()
    s.check()
    assert s.return_hosts()["returned"] == 2
    reader = SlurmFleet.reader(cfg)
    writes = len(reader.cli.writes)
    seen = {h.name: h for h in reader.hosts()}
    assert seen["n5"].state == HostState.SERVING and seen["n5"].versions == TARGETS, seen["n5"]
    assert seen["n1"].versions == {}  # never verified by Railyard: nothing claimed
    assert reader.cli.writes[writes:] == []
    with pytest.raises(FleetError, match="only reads"):
        reader.drain(["n1"], "slurm/run1/rack-a")  # its CLI refuses every write
    assert "DRAIN" not in next(n for n in json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"]
                               if n["name"] == "n1")["state_flags"]


def test_a_job_that_never_checkpoints_is_requeued_by_policy_and_the_loss_recorded(world, cluster: SlurmCluster):
    cfg, fleet, ledger = world(checkpoint={"policy": "requeue", "grace_s": 2})
    jid = submit(cluster, nodes=1, steps=400, extra=("--nodelist=n7",))
    cluster._wait("job running", lambda: job_log(cluster, jid), timeout=30)
    cluster.cli("scontrol", "update", f"jobid={jid}", "comment=deaf")  # ignores USR1 from here on
    cluster.cli("scancel", "--signal=STOP", "--batch", jid)  # a hung job: signals do nothing
    from railyard.operations.stop import Stop

    s = Stop(config=cfg, train=cfg.train("slurm"), domain=cfg.domain("rack-d"), op_id="slurm/deaf/rack-d",
             fleet=fleet, ledger=ledger)
    out = run_stop(s)
    assert out["return"]["returned"] == 2
    losses = fleet.losses()
    assert [x["job"] for x in losses] == [jid] and losses[0]["last_checkpoint"] is None


def test_the_controller_dies_during_a_stop_and_the_train_resumes(world, cluster: SlurmCluster):
    cfg, fleet, ledger = world()
    jobs = [submit(cluster, nodes=2, steps=400) for _ in range(2)]
    cluster._wait("jobs running", lambda: all(job_log(cluster, j) for j in jobs), timeout=30)
    import threading

    killed = threading.Event()

    def chaos(sampler: Sampler) -> None:
        while not sampler.first_drained().keys() & {"n3", "n4"}:
            time.sleep(0.1)
        cluster.kill_ctld()
        if "DOWN" in cluster.cli("scontrol", "ping", check=False).stdout:
            killed.set()
        time.sleep(5)
        cluster.start_ctld()

    with Sampler(cluster) as sampler:
        t = threading.Thread(target=chaos, args=(sampler,), daemon=True)
        t.start()
        run_train(cfg, fleet, ledger, "slurm", run_id="chaos")
        t.join(timeout=60)
        sampler.sample()
    assert killed.is_set()  # the controller really was gone (scontrol ping: DOWN) for 5 s mid-stop
    drained_at = sampler.first_drained()
    assert {"n3", "n4", "n5", "n6", "n7", "n8"} <= set(drained_at)  # the stops after the outage ran too
    nodes = json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"]
    assert not [(n["name"], n["state"], n["state_flags"]) for n in nodes
                if "DRAIN" in n["state_flags"] or n["state"] not in ("idle", "mixed", "allocated")]
    assert all(h.state == HostState.SERVING and h.versions == TARGETS for h in fleet.hosts())
    assert ledger.holdings() == {}
    assert sampler.max_domains_out(cfg.host_domain()) == 1


def test_commands_over_ssh_are_quoted_argv(tmp_path: Path):
    from railyard.domain.config.slurm import SlurmSpec

    spec = SlurmSpec(transport="ssh", ssh={"host": "ctl1", "key_file": "/k", "known_hosts": "/kh"},
                     slurm_conf="/etc/slurm/slurm.conf")
    argv = SlurmCli(spec)._wrap(["scontrol", "update", "nodename=n1", "state=drain", "reason=railyard op=x"])
    assert argv[:2] == ["ssh", "-p"] and "StrictHostKeyChecking=yes" in argv
    assert argv[-1] == "SLURM_CONF=/etc/slurm/slurm.conf scontrol update nodename=n1 state=drain 'reason=railyard op=x'"
    assert isinstance(SlurmFleet, type)


def test_domains_derived_from_slurm(world, cluster: SlurmCluster):
    cfg, fleet, _ = world(domains_from={"pattern": r"n(?P<domain>[1-4])"})
    assert fleet.derived_domains() == {"1": ["n1"], "2": ["n2"], "3": ["n3"], "4": ["n4"]}
    cluster.cli("scontrol", "update", "nodename=n1,n2", "availablefeatures=rack-a1", "activefeatures=rack-a1")
    _, by_feature, _ = world(domains_from={"feature_prefix": "rack-"})
    assert by_feature.derived_domains() == {"a1": ["n1", "n2"]}
    _, by_partition, _ = world(domains_from={"partition": True})
    assert by_partition.derived_domains() == {"gpu": [f"n{i}" for i in range(1, 9)]}
    with pytest.raises(ValueError, match="named group"):
        world(domains_from={"pattern": "n[0-9]"})


def test_a_maintenance_reservation_overlaps_someone_elses_and_leaves_it_alone(world, cluster: SlurmCluster):
    """Slurm lets a MAINT reservation overlap others (flags=maint): ours is made beside theirs, and only
    ours is deleted on return."""
    cfg, fleet, ledger = world()
    cluster.cli("scontrol", "create", "reservation", "reservationname=ml_team_demo", "starttime=now",
                "duration=60", "nodes=n1,n2", "users=root")
    try:
        fleet.reserve("slurm/overlap/rack-a", ["rack-a"])
        res = fleet.reservations()
        assert {"ml_team_demo", "railyard_rack-a"} <= set(res)
        assert "MAINT" in res["railyard_rack-a"]["Flags"] and res["ml_team_demo"]["Nodes"] == "n[1-2]"
        assert fleet.unreserve(["rack-a"]) == ["railyard_rack-a"]
        assert set(fleet.reservations()) == {"ml_team_demo"}
    finally:
        cluster.cli("scontrol", "delete", "reservationname=ml_team_demo")


REAL_SLURM = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "slurm"


def _keys(doc: dict, part: str) -> set[str]:
    return {k for item in doc.get(part, []) for k in item}


def test_the_reads_railyard_runs_on_the_live_cluster_match_the_recorded_corpus(world, cluster: SlurmCluster):
    """The live check of the 22.05 corpus: the exact commands the fleet's reads run, on the test cluster with
    an admin's drain and a running job, print documents of the recorded shape (every node and job field the
    corpus holds, and no other). `RAILYARD_RECORD_SLURM=1` writes what they printed into the corpus instead."""
    import os

    cfg, fleet, _ledger = world()
    cluster.cli("scontrol", "update", "nodename=n2", "state=drain", "reason=admin: bad dimm")
    job = submit(cluster, nodes=2, steps=400)
    cluster._wait("job running", lambda: job_log(cluster, job), timeout=30)
    seen: list[tuple[tuple[str, ...], str]] = []
    run = fleet.cli.run

    def recorded(*argv: str, **kw) -> str:  # noqa: ANN003
        out = run(*argv, **kw)
        seen.append((argv, out))
        return out

    fleet.cli.run = recorded  # type: ignore[method-assign]
    hosts = {h.name: h for h in fleet.hosts()}
    jobs = fleet.jobs()
    assert [argv for argv, _ in seen] == [("scontrol", "--version"), ("sinfo", "--json"), ("squeue", "--json")], seen
    assert hosts["n2"].state == HostState.FAILED and "bad dimm" in (hosts["n2"].reason or "")
    assert job in {j.id for j in jobs}
    version = seen[0][1].split()[1]
    assert version.startswith("22.05."), version
    docs = {"sinfo": json.loads(seen[1][1]), "squeue": json.loads(seen[2][1])}
    if os.environ.get("RAILYARD_RECORD_SLURM"):
        for cmd, (_argv, out) in zip(("sinfo", "squeue"), seen[1:], strict=True):
            (REAL_SLURM / f"22.05-{cmd}-live.json").write_text(out)
        (REAL_SLURM / "22.05-version-live.txt").write_text(seen[0][1])
    corpus_sinfo = json.loads((REAL_SLURM / "22.05-sinfo-live.json").read_text())
    corpus_squeue = json.loads((REAL_SLURM / "22.05-squeue-live.json").read_text())
    assert _keys(docs["sinfo"], "nodes") == _keys(corpus_sinfo, "nodes")
    assert _keys(docs["squeue"], "jobs") == _keys(corpus_squeue, "jobs")
    assert (REAL_SLURM / "22.05-version-live.txt").read_text().split()[1] == version
