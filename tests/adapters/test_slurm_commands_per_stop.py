"""The Slurm commands a stop runs do not grow with its domain: a stop over 8 nodes and one over 64 (with a
running job on every 8 nodes, asked to checkpoint and requeued at the drain) run the same commands, counted
by program and subcommand, on a real 64-node cluster (multiple slurmd) started by the test."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from railyard.backends.slurm.commands import chunks, compress_hostlist, expand_hostlist
from tests.support.slurm_cluster import SlurmCluster, job_log, running_cluster
from tests.support.slurm_count import counted_stop, kind


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from running_cluster(nodes=64)  # ~5 s to start and ~360 MB here (2 cores, 24 GiB)


def test_a_stop_runs_the_same_slurm_commands_at_8_and_at_64_nodes(cluster: SlurmCluster, tmp_path: Path):
    small = counted_stop(cluster, tmp_path / "s8", 8)
    big = counted_stop(cluster, tmp_path / "s64", 64)
    for run in (small, big):
        assert run.result["return"] == {"returned": run.nodes, "offboarded": []}, run.result
        assert run.result["check"]["passed"] == run.nodes, run.result
    assert (small.jobs, big.jobs) == (1, 8)

    # the stop's own calls, each wait's repeated read counted once: the same calls, the same commands
    assert [c.method for c in big.log.stop_calls()] == [c.method for c in small.log.stop_calls()]
    assert big.log.per_stop() == small.log.per_stop(), (small.log.per_stop(), big.log.per_stop())
    # and every poll and tend, however many a wait made, ran what the same call runs at 8 nodes
    both = small.log.per_call().keys() & big.log.per_call().keys()
    assert {m: big.log.per_call()[m] for m in both} == {m: small.log.per_call()[m] for m in both}

    # the domain is named as one hostlist, and its 8 jobs in one command each
    writes = [c for c in big.log.commands() if kind(c).startswith(("scontrol update node", "scontrol create"))]
    assert {a for c in writes for a in c if a.startswith(("nodename=", "nodes="))} == {"nodename=n[1-64]",
                                                                                     "nodes=n[1-64]"}, writes
    (requeue,) = [c for c in big.log.commands() if kind(c) == "scontrol requeue"]
    (signal,) = [c for c in big.log.commands() if kind(c) == "scancel"]
    assert len(requeue[2].split(",")) == 8 and len([a for a in signal if a.isdigit()]) == 8, (requeue, signal)
    for jid in requeue[2].split(","):  # each job checkpointed when asked, then was ended by the drain
        words = [line[0] for line in job_log(cluster, jid)]
        assert "ckpt" in words and "term" in words and words.index("ckpt") < words.index("term"), words


def test_hostlists_expand_in_slurm_to_the_names_they_were_made_of(cluster: SlurmCluster):
    """`compress_hostlist` against Slurm's own `scontrol show hostnames`, and a long gappy list split into
    arguments that each fit and together name every node once."""
    rng = random.Random(7)
    sets = [
        [f"n{i}" for i in range(1, 65)],
        ["n3", "n1", "n2", "n10", "n11", "gpu-a01", "gpu-a02"],
        [f"gpu-a{i:03d}" for i in (98, 99, 100, 101, 7)],
        ["n9", "n10", "n010", "n-ib", "login", "n7"],
        [f"rack{r}-node{i:02d}" for r in (1, 2) for i in rng.sample(range(1, 40), 12)],
    ]
    for names in sets:
        expr = compress_hostlist(names)
        got = cluster.cli("scontrol", "show", "hostnames", expr).stdout.split()
        assert sorted(got) == sorted(set(names)), (names, expr, got)
        assert sorted(expand_hostlist(expr)) == sorted(set(names)), expr
    gappy = [f"gpu-b{i:05d}" for i in range(1, 6000, 3)]
    parts = chunks(gappy, "nodename=")
    assert len(parts) > 1 and all(len(p) <= 512 for p in parts)
    assert sorted(h for p in parts for h in expand_hostlist(p.removeprefix("nodename="))) == sorted(gappy)
    got = cluster.cli("scontrol", "show", "hostnames", parts[1].removeprefix("nodename=")).stdout.split()
    assert got == expand_hostlist(parts[1].removeprefix("nodename="))
