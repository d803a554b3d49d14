"""Maintenance domains derived from Slurm: by node-name pattern, partition or feature.

DAGs are built at parse time with no I/O, so the config still lists the domains; this derives the
list from the live cluster (`SlurmFleet.derived_domains()`), to write into the config or to compare
with it.
"""

from __future__ import annotations

import re
from typing import Any

from railyard.backends.slurm import parse
from railyard.domain.config.slurm import DomainRuleSpec
from railyard.domain.models import check_token


def derive_domains(nodes: list[dict[str, Any]], rule: DomainRuleSpec) -> dict[str, list[str]]:
    """{domain: sorted node names} from `sinfo --json` node records; nodes that match nothing are left out."""
    out: dict[str, list[str]] = {}
    for n in nodes:
        name = parse.node_name(n)
        domain: str | None = None
        if rule.pattern is not None:
            m = re.fullmatch(rule.pattern, name)
            domain = m.group("domain") if m else None
        elif rule.partition:
            row = n.get("partition")  # a 23.02+ sinfo row names its partition
            parts = n.get("partitions") or ([row["name"]] if isinstance(row, dict) and row.get("name") else [])
            domain = parts[0] if parts else None
        elif rule.feature_prefix is not None:
            feats = [f for f in parse.node_features(n) if f.startswith(rule.feature_prefix)]
            domain = feats[0][len(rule.feature_prefix):] if feats else None
        if domain:
            out.setdefault(check_token(domain), []).append(check_token(name))
    return {d: sorted(v, key=lambda x: (len(x), x)) for d, v in sorted(out.items())}
