"""Serving: plain modules (decode, options, responses, service) and a thin TorchServe adapter.

Only ``torchserve_handler`` imports TorchServe; everything else is ordinary Python tested
in-process, so the model logic outlives TorchServe (upstream is in limited maintenance).
"""
