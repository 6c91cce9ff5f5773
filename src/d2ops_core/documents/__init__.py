"""Documents written in one place and read in another: one pydantic model each, imported by both sides.

Standard library and pydantic only: this package ships in the Lambda layer (template.yaml
CoreLayer: ``src/``) and in the training and serving images (``pip install`` of ``src/``).
"""
