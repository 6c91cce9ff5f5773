"""The test suite. A regular package, so `python -m tests.…` finds these files: the sagemaker SDK
dependency (smdebug_rulesconfig) installs a top-level `tests` package into site-packages, which
would otherwise win over this namespace directory."""
