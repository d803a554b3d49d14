"""What Railyard does: a train's stop, an emergency, the repair gate, the reconciler, releases,
escalations, operator actions. Over `domain`, the ledger and the fleet port only."""
