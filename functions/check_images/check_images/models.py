"""The batch Lambda's input: what the Distributed Map's ItemBatcher hands each child execution."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.run_ids import RUN_ID_PATTERN
from d2ops_core.validation.inventory import ImageItem


class BatchInput(BaseModel):
    """``ItemBatcher.BatchInput``: the same for every batch of the run."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    bucket: str = Field(min_length=3, max_length=63, description="the DataBucket")
    prefix: str = Field(min_length=1, max_length=900, description="datasets/<name>/<version>/")
    run_id: str = Field(pattern=RUN_ID_PATTERN, description="the Step Functions execution name: the "
                                                                       "snapshot goes to runs/<run id>/dataset/")


class ImageBatchEvent(BaseModel):
    """``{"BatchInput": {...}, "Items": [ImageItem, ...]}`` (Step Functions' batch shape)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    BatchInput: BatchInput
    Items: list[ImageItem] = Field(min_length=1, max_length=1000)
