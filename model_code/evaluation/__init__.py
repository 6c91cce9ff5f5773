"""Evaluation through the exported artifact and the shared inference code (no training framework)."""
