"""The forms of one detector an artifact can hold: TorchScript, a torch.export program, an AOTInductor package.

TorchScript is deprecated in PyTorch (its pages point to ``torch.export``), and AOTInductor packages
are the deployment successor (issue 33). The export step therefore also tries to write, beside
``model.pt``:

- ``model.pt2``: ``torch.export.export`` of the same eager signature module (uint8 RGB [3, H, W]
  images in; boxes/scores/labels(/masks) out), exported for one image whose height and width are
  symbolic, saved with ``torch.export.save``;
- ``model.aoti.pt2``: that program compiled ahead of time by AOTInductor for one device type
  (``torch._inductor.aoti_compile_and_package``); opt-in (``AOTI_ENV``), its compile time is
  minutes on CPU (docs/model-artifact.md, "Forms").

A form that cannot be exported is left out and the reason, naming the framework call that stopped
it, goes into the metadata (``export_problems``); TorchScript stays the form every artifact holds.
Loading gives every form the same callable: a list of images in, a list of result dicts out, so
``model_code.inference.predict``, evaluation and serving do not know which form they run.
This module needs torch only, never a training framework.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

import torch
from torch import Tensor, nn

Form = Literal["torchscript", "exported", "aoti"]
AotiDevice = Literal["cpu", "cuda"]
FORMS: tuple[Form, ...] = get_args(Form)
# Serving (and anything else that loads an artifact) runs this form instead of the best one the device can run.
FORM_ENV = "D2OPS_MODEL_FORM"
# The export step compiles the AOTInductor package only when this names its device: "cpu" (or "1") or "cuda"
# (the serving device; a compile takes about a minute of CPU even for a resnet18-FPN backbone alone).
AOTI_ENV = "D2OPS_EXPORT_AOTI"
TORCHSCRIPT_FILE = "model.pt"
EXPORTED_FILE = "model.pt2"
AOTI_FILE = "model.aoti.pt2"
FORM_FILES: dict[Form, str] = {"torchscript": TORCHSCRIPT_FILE, "exported": EXPORTED_FILE, "aoti": AOTI_FILE}
# Image sides the exported program accepts (torch.export specialises sizes 0 and 1, hence 2).
MIN_SIDE, MAX_SIDE = 2, 16384
_FRAMEWORK_DIRS = ("/detectron2/", "/torchvision/", "/model_code/")

Detector = Callable[[list[Tensor]], list[dict[str, Tensor]]]


class FormError(Exception):
    """A form asked for that the artifact does not hold or the device cannot run (one line)."""


@dataclass
class ExportOutcome:
    """What the export step wrote beside model.pt: the forms, why any is missing, and what each cost."""

    forms: list[Form] = field(default_factory=lambda: cast(list[Form], ["torchscript"]))
    problems: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    aoti_device: AotiDevice | None = None

    def summary(self) -> str:
        """One log line: the forms written (with their seconds) and why any other is missing."""
        written = ", ".join(f"{f} ({self.seconds[f]} s)" if f in self.seconds else f for f in self.forms)
        missing = "; ".join(f"no {form}: {why}" for form, why in self.problems.items())
        return f"model forms: {written}" + (f"; {missing}" if missing else "")


def aoti_requested(environ: Mapping[str, str] | None = None) -> AotiDevice | None:
    """The device $D2OPS_EXPORT_AOTI asks the AOTInductor package for; None: not asked (the default)."""
    value = (os.environ if environ is None else environ).get(AOTI_ENV, "").strip().lower()
    if value in ("", "0"):
        return None
    if value in ("1", "cpu", "cuda"):
        return "cuda" if value == "cuda" else "cpu"
    raise ValueError(f"{AOTI_ENV}={value!r}: expected cpu (or 1), cuda, or 0 / unset for no AOTInductor package")


@contextlib.contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """torch.export prints the whole partial graph to stderr (thousands of lines) when it gives up, and logs
    warnings about it; the job's log gets the one-line reason instead (describe_failure)."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith("torch")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def export_program(module: nn.Module, sample: Tensor) -> torch.export.ExportedProgram:
    """torch.export of an eager detector with the artifact's signature, for one image of any height and width."""
    height = torch.export.Dim("height", min=MIN_SIDE, max=MAX_SIDE)
    width = torch.export.Dim("width", min=MIN_SIDE, max=MAX_SIDE)
    with torch.no_grad(), _quiet_torch_logs():
        return torch.export.export(module.eval(), ([sample],), dynamic_shapes=([{1: height, 2: width}],),
                                   strict=False)


def describe_failure(exc: BaseException) -> str:
    """One line: the error's first line and the innermost framework (or d2ops) line that raised it."""
    frames: list[traceback.FrameSummary] = []
    seen: BaseException | None = exc
    while seen is not None:  # the export's own wrapper errors chain the framework's
        frames[:0] = traceback.extract_tb(seen.__traceback__)
        seen = seen.__cause__ or seen.__context__
    text = str(exc).strip()
    first = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
    ours = [f for f in frames if any(d in f.filename for d in _FRAMEWORK_DIRS)]
    if ours:
        f = ours[-1]
        path = f.filename.split("site-packages/")[-1]
        first = f"{path}:{f.lineno} in {f.name} (`{(f.line or '').strip()}`): {first}"
    return first[:400]


def write_forms(directory: Path, module: nn.Module, sample: Tensor, *, aoti: bool | AotiDevice | None,
                aoti_device: str = "cpu") -> ExportOutcome:
    """Export ``module`` (eager, the artifact's signature) to model.pt2 and, with ``aoti``, model.aoti.pt2.

    ``aoti``: True (on ``aoti_device``), a device type (what aoti_requested returns), or False/None.
    Never raises for a model that does not export: the outcome says why, and the artifact keeps
    its TorchScript form. Files are written under a temporary name and renamed.
    """
    if isinstance(aoti, str):
        aoti_device, aoti = aoti, True
    outcome = ExportOutcome()
    start = time.perf_counter()
    tmp = directory / f"tmp-{EXPORTED_FILE}"  # torch.export.save and the AOTI packager want a .pt2 name
    try:
        program = export_program(module, sample)
        torch.export.save(program, str(tmp))
        os.replace(tmp, directory / EXPORTED_FILE)
    except Exception as exc:  # any failure to export is a finding to record, not a failed job
        tmp.unlink(missing_ok=True)
        outcome.problems["exported"] = describe_failure(exc)
        if aoti:
            outcome.problems["aoti"] = "needs the exported program, which failed"
        return outcome
    finally:
        outcome.seconds["exported"] = round(time.perf_counter() - start, 3)
    outcome.forms.append("exported")
    if not aoti:
        return outcome
    start = time.perf_counter()
    tmp = directory / f"tmp-{AOTI_FILE}"
    try:
        if aoti_device != "cpu":
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, aoti_device)
        with _quiet_torch_logs():
            torch._inductor.aoti_compile_and_package(program, package_path=str(tmp))
        os.replace(tmp, directory / AOTI_FILE)
        outcome.forms.append("aoti")
        outcome.aoti_device = cast(AotiDevice, torch.device(aoti_device).type)
    except Exception as exc:  # a compiler failure likewise
        tmp.unlink(missing_ok=True)
        outcome.problems["aoti"] = describe_failure(exc)
    finally:
        outcome.seconds["aoti"] = round(time.perf_counter() - start, 3)
    return outcome


def choose_form(available: list[Form], aoti_device: AotiDevice | None, device: str, requested: str | None,
                problems: dict[str, str]) -> Form:
    """The form to load: ``requested`` (else $D2OPS_MODEL_FORM) when the artifact holds it and the device can
    run it, else the best the device can run: AOTInductor built for it, else TorchScript (the proven one)."""
    if requested is None:
        requested = os.environ.get(FORM_ENV) or None
    device_type = torch.device(device).type
    if requested is None:
        return "aoti" if "aoti" in available and aoti_device == device_type else "torchscript"
    if requested not in FORMS:
        raise FormError(f"{FORM_ENV}={requested!r} is not a model form: one of {', '.join(FORMS)}")
    form = cast(Form, requested)
    if form not in available:
        why = f": {problems[form]}" if form in problems else " (exported before the form existed)"
        raise FormError(f"the artifact holds no {form} form, only {', '.join(available)}{why}")
    if form == "aoti" and aoti_device != device_type:
        raise FormError(f"the artifact's AOTInductor package was built for {aoti_device}, not {device_type}; "
                        f"unset {FORM_ENV} or choose exported/torchscript")
    return form


class OneImageAtATime:
    """A program exported for one image, called with a batch: the artifact's signature for either compiled form.

    The exported program's input is a list of exactly one image (its height and width symbolic); a
    batch of several sizes runs image by image, which is also what both R-CNN frameworks do inside.
    """

    def __init__(self, run: Callable[..., Any], form: Form) -> None:
        self._run = run
        self.form = form

    def __call__(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        return [self._run([image])[0] for image in images]


def load_compiled(directory: Path, form: Form, device: str) -> OneImageAtATime:
    """Load model.pt2 (on ``device``) or model.aoti.pt2 (built for the device's type) as a Detector."""
    path = directory / FORM_FILES[form]
    if form == "exported":
        program = torch.export.load(str(path))
        if torch.device(device).type != "cpu":
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, device)
        return OneImageAtATime(program.module(), form)
    target = torch.device(device)
    loaded = torch._inductor.aoti_load_package(str(path), device_index=target.index if target.index is not None else -1)
    return OneImageAtATime(loaded, form)
