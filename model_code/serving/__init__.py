"""Serving: plain modules (decode, options, responses, service) and two thin server adapters.

Only ``torchserve_handler`` imports TorchServe and only ``ray_serve_app`` imports Ray; everything
else is ordinary Python tested in-process, so the model logic outlives TorchServe (archived upstream):
``D2OPS_SERVING_BACKEND`` (``backends``) picks the server.
"""
