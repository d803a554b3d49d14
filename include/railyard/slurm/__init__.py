"""The Slurm backend: a `Fleet` over a real Slurm cluster (`railyard.slurm.fleet.SlurmFleet`).

Kept import-light: `railyard.config` imports `railyard.slurm.config` from here.
"""
