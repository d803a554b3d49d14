"""Railyard: maintenance trains for GPU fleets. The layers, and which way imports go (docs/design.md):

- `domain`: the words and the rules (hosts, config, recipes, windows, planning); imports nothing else here
- `ledger`: the operations ledger (leases, records, audit) over SQLite or PostgreSQL; imports `domain`
- `fleet`: the port every backend implements, its optional capabilities, and `build_fleet`
- `operations`: what a train, an emergency, the reconciler and the repair gate do; over `domain`, the
  ledger and the fleet port only
- `backends`: the fleets over SSH hosts and Slurm (and the host-runner port they share)
- `sim`: the fleet simulator; `tools`: sizing and fleet studies; `devstack`: the local stack and the demo;
  `cli`: the `railyard` command
"""
