"""Local containers: the images' declared entries run on this machine (jobs, endpoints, their logs)."""
