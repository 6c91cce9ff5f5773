"""After deployment: which captured images to label next, and the round trip through Label Studio (issue 32).

- :mod:`d2ops.labelling.documents`: the selection (``selection.json`` + ``images/``) that ``d2ops label select``
  writes and ``d2ops label export`` reads.
- :mod:`d2ops.labelling.selection`: ranking captured images (``d2ops label select``; docs/labelling.md).
"""
