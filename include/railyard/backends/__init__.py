"""Fleets over real systems: plain SSH hosts (`ssh`), a Slurm cluster (`slurm`), and the host-runner port
they share (`hosts`). Each implements `railyard.fleet.port.Fleet`; none imports `railyard.operations`."""
