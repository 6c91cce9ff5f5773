"""Validate one dataset version in S3 (the pipeline's first state)."""
