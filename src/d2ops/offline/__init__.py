"""The offline runtime: the stack on loopback (moto, local SageMaker, local endpoints), developer tooling only."""
