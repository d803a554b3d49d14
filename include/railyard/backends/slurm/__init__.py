"""The Slurm backend: a `Fleet` over a real Slurm cluster (`railyard.backends.slurm.fleet.SlurmFleet`).

Kept import-light: `railyard.domain.config` imports `railyard.domain.config.slurm` from here.
"""
