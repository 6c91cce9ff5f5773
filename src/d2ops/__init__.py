"""d2ops: from a labelled COCO dataset to a safely deployed detector on AWS."""
