"""The AWS APIs the offline runtime emulates itself (moto serves the rest), one module each.

Adding one is one module and one line: a class as `base` describes (its boto3 name, its
``AWS_ENDPOINT_URL_*`` variable, how the runtime builds it, which requests are its) and its entry
in `SERVICES`. The runtime points boto3 at the loopback endpoint (`d2ops.offline.aws_endpoint`)
for each, builds each, and the endpoint hands a request to the first service that accepts it.
"""

from __future__ import annotations

from d2ops.offline.services.base import EmulatedService
from d2ops.offline.services.sagemaker import LocalSageMaker
from d2ops.offline.services.sagemaker_runtime import SageMakerRuntime
from d2ops.offline.services.service_quotas import OfflineServiceQuotas
from d2ops.offline.services.stepfunctions import LocalStepFunctions

# In the order the endpoint asks them (a REST path first, then the X-Amz-Target prefixes).
SERVICES: tuple[type[EmulatedService], ...] = (
    SageMakerRuntime,  # InvokeEndpoint: POST /endpoints/<name>/invocations -> the endpoint's TorchServe
    OfflineServiceQuotas,  # ServiceQuotasV20190624.*: SageMaker's quotas; other service codes -> moto
    LocalStepFunctions,  # AWSStepFunctions.*: the ASL interpreter
    LocalSageMaker,  # SageMaker.*: jobs and endpoints; models, configs, packages -> moto
)

__all__ = ["SERVICES", "LocalSageMaker", "LocalStepFunctions", "OfflineServiceQuotas", "SageMakerRuntime"]
