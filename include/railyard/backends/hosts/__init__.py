"""Host runners: how upgrades and health checks reach a host (SSH, or a stand-in for tests)."""
