"""Check one Distributed Map batch of image files (the pipeline's Check images map)."""
