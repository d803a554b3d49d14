"""Hostlists: how Railyard names many nodes (or jobs) in one Slurm argument. Checked against Slurm's own
`scontrol show hostnames` in tests/adapters/test_slurm_commands_per_stop.py."""

from __future__ import annotations

import pytest

from railyard.backends.slurm.commands import ARG_MAX, check_arg, chunks, compress_hostlist, expand_hostlist, joined


@pytest.mark.parametrize(("names", "expr"), [
    (["n3", "n1", "n2", "n10", "n11", "gpu-a01", "gpu-a02"], "gpu-a[01-02],n[1-3,10-11]"),
    ([f"gpu-a{i:03d}" for i in range(1, 129)], "gpu-a[001-128]"),  # 100-128 join the padded ones
    (["n09", "n10", "n11", "n7"], "n7,n[09-11]"),
    (["n5"], "n5"),
    (["login", "n-ib", "n5", "n5"], "login,n5,n-ib"),  # no trailing number: as it is; duplicates once
    (["rack1-node3", "rack1-node4", "rack2-node3"], "rack1-node[3-4],rack2-node3"),
    ([], ""),
])
def test_compress_hostlist(names: list[str], expr: str) -> None:
    assert compress_hostlist(names) == expr
    assert sorted(expand_hostlist(expr)) == sorted(set(names))


def test_chunks_fit_one_argument_each_and_name_every_node_once() -> None:
    assert chunks([f"n{i}" for i in range(64, 0, -1)], "nodename=") == ["nodename=n[1-64]"]
    assert chunks([]) == []
    gappy = [f"gpu-b{i:05d}" for i in range(1, 6000, 3)]  # 2,000 names, no two adjacent
    parts = chunks(gappy, "nodename=")
    assert 1 < len(parts) < 40 and all(len(p) <= ARG_MAX for p in parts)
    for p in parts:
        check_arg(p)
    assert [h for p in parts for h in expand_hostlist(p.removeprefix("nodename="))] == sorted(gappy)


def test_joined_ids_fit_one_argument_each() -> None:
    assert joined(["7", "8", "9"]) == ["7,8,9"]
    assert joined([]) == []
    ids = [str(10_000_000 + i) for i in range(200)]
    parts = joined(ids, "--jobs=")
    assert len(parts) > 1 and all(len(p) <= ARG_MAX for p in parts)
    assert [i for p in parts for i in p.removeprefix("--jobs=").split(",")] == ids
