"""Plain hosts over SSH: the `SshRunner` (host-runner port), the `SshFleet` (fleet port), the checks."""
