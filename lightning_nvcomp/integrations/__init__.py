"""Framework integrations: Lightning (CheckpointIO + savings callback); more to come."""
