"""d2ops core: what every room of the pipeline shares, and the only d2ops code that ships.

Run ids and the S3 layout, the champion record and endpoint history, metric names and the
task -> primary-metric rule, dataset validation, the image-format rule, cost, and the pydantic
models of the documents passed between Lambdas, jobs and the status API. The Lambda layer and the
training and serving images carry this package and nothing else of d2ops; the `d2ops` package
(CLI, offline runtime, ASL interpreter, benchmarks) is developer tooling. It imports neither d2ops
nor any training framework (import-linter's "core" contract in pyproject.toml).
"""
