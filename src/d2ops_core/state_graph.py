"""A picture of a run: the pipeline's stages, each with the states the run went through (SVG, or PNG).

The top level is the stages a user thinks in (d2ops_core.pipeline_stages: validate, prepare, train,
evaluate, gate, deploy, notify, report failure), one column each, left to right, each headed by the
run's outcome in it and its time. Below a stage's head, the states the run went through there, in
order, as d2ops_core.stage_timeline reads them: a wait loop is one box ("Wait for endpoint \u00d710"),
an expected miss is ``missed``, not ``failed``. The states the run never reached (the recovery machinery
of a healthy run) are folded into one "+N not reached" box whose tooltip names them. The run's way
from stage to stage is drawn bold. No graphviz binary is needed: the layout is computed here.

``layout`` still lays out every state of the definition (the status API's ``nodes``/``edges``, for
clients that draw the whole machine); ``stage_view`` is what ``d2ops graph`` and the console draw.
Standard library only (matplotlib only for PNG): `d2ops graph` and the status API's
``GET /runs/{runId}/graph`` (through the CoreLayer) share it.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d2ops_core.pipeline_stages import STAGES, Stage, all_states, definition_states
from d2ops_core.stage_timeline import (
    OTHER,
    Line,
    Step,
    human_duration,
    line_title,
    stage_statuses,
    steps_from_history,
    summarise,
)

COLOURS = {"succeeded": "#2e7d32", "failed": "#c62828", "caught": "#ef6c00", "running": "#1565c0",
           "not reached": "#9e9e9e", "missed": "#6d4c41"}
FILLS = {"succeeded": "#e8f5e9", "failed": "#ffebee", "caught": "#fff3e0", "running": "#e3f2fd",
         "not reached": "#fafafa", "missed": "#efebe9"}
BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 190, 40, 24, 34, 24


@dataclass
class Node:
    name: str
    kind: str
    status: str
    x: float = 0.0
    y: float = 0.0


@dataclass
class Edge:
    source: str
    target: str
    kind: str  # next | choice | default | catch
    taken: bool


def transitions(state: dict[str, Any]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if "Next" in state:
        found.append((state["Next"], "next"))
    for choice in state.get("Choices", []):
        found.append((choice["Next"], "choice"))
    if "Default" in state:
        found.append((state["Default"], "default"))
    for catch in state.get("Catch", []):
        found.append((catch["Next"], "catch"))
    return found


def outcomes(definition: dict[str, Any], history: list[dict[str, Any]], execution_status: str) -> tuple[
        dict[str, str], set[tuple[str, str]]]:
    """Each state's outcome in the run (the stages' states included), and the transitions it took."""
    states = all_states(definition)
    status: dict[str, str] = {}
    taken: set[tuple[str, str]] = set()
    previous: str | None = None
    current: str | None = None
    for event in history:
        kind = event["type"]
        if kind.endswith("StateEntered"):
            name = event["stateEnteredEventDetails"]["name"]
            if name not in states:
                continue  # a state of another version of the definition
            if previous is not None:
                taken.add((previous, name))
            current = name
            status[name] = "failed" if states[name]["Type"] == "Fail" else "running"
            if states[name]["Type"] in ("Parallel", "Map"):
                previous = None  # its branch's first state is entered from no state of the branch
        elif kind.endswith("StateExited"):
            name = event["stateExitedEventDetails"]["name"]
            if name not in states:
                continue
            status[name] = "caught" if status.get(name) == "error" else "succeeded"
            previous = name
        elif ((kind.endswith("Failed") or kind.endswith("TimedOut")) and not kind.startswith("Execution")
              and current is not None and status.get(current) == "running"):
            status[current] = "error"
    for name, value in status.items():
        if value in ("running", "error"):
            status[name] = "running" if execution_status == "RUNNING" and value == "running" else "failed"
    return status, taken


def layout(definition: dict[str, Any], status: dict[str, str], taken: set[tuple[str, str]]) -> tuple[
        list[Node], list[Edge]]:
    states = definition["States"]
    # Rows by the longest path from StartAt once loops are cut, so shared sinks (the failure
    # notification, the Fail states) sit below everything that leads to them.
    back: set[tuple[str, str]] = set()
    seen: set[str] = set()
    on_stack: list[str] = []
    order: list[str] = []

    def visit(name: str) -> None:
        seen.add(name)
        on_stack.append(name)
        for target, _ in transitions(states[name]):
            if target in on_stack:
                back.add((name, target))
            elif target not in seen:
                visit(target)
        on_stack.pop()
        order.append(name)

    visit(definition["StartAt"])
    depth: dict[str, int] = {definition["StartAt"]: 0}
    for name in reversed(order):  # a topological order of the graph without its back edges
        for target, _ in transitions(states[name]):
            if (name, target) not in back:
                depth[target] = max(depth.get(target, 0), depth.get(name, 0) + 1)
    for name in states:  # unreachable states (a definition error) still get drawn, at the bottom
        depth.setdefault(name, max(depth.values()) + 1)
    rows: dict[int, list[str]] = {}
    for name in states:
        rows.setdefault(depth[name], []).append(name)
    nodes = []
    for row, names in sorted(rows.items()):
        # Visited states first, so the run's path tends to run down the left-hand side.
        names.sort(key=lambda n: (status.get(n, "not reached") == "not reached", list(states).index(n)))
        for col, name in enumerate(names):
            nodes.append(Node(name=name, kind=states[name]["Type"], status=status.get(name, "not reached"),
                              x=MARGIN + col * (BOX_W + GAP_X), y=MARGIN + row * (BOX_H + GAP_Y)))
    edges = [Edge(source=name, target=target, kind=kind, taken=(name, target) in taken)
             for name, state in states.items() for target, kind in transitions(state)]
    return nodes, edges


@dataclass
class StageView:
    """One stage of the run: its outcome and time, the lines the run went through there, what it never reached."""

    key: str
    title: str
    status: str  # succeeded | caught | failed | running | not reached
    seconds: float | None
    lines: list[Line] = field(default_factory=list)
    folded: list[str] = field(default_factory=list)  # its states the run never entered
    next_stages: list[str] = field(default_factory=list)  # stage keys the run went to from here


def stage_view(definition: dict[str, Any], steps: Sequence[Step | Any]) -> list[StageView]:
    """Every stage of STAGES in order (and "other" for states of another version, when a run has any), with
    the run's steps (d2ops_core.stage_timeline.Step, the status API's StateSteps or their JSON) placed in them."""
    stays = summarise(steps)
    statuses = stage_statuses(stays)
    known = set(definition_states(definition))
    stages: list[Stage] = list(STAGES) + ([OTHER] if any(r.stage is OTHER for r in stays) else [])
    views = []
    for stage in stages:
        mine = [r for r in stays if r.stage.key == stage.key]
        lines = [line for r in mine for line in r.lines]
        entered = {name for line in lines for name in line.states}
        seconds = [r.seconds for r in mine if r.seconds is not None]
        views.append(StageView(key=stage.key, title=stage.title, status=statuses.get(stage.key, "not reached"),
                               seconds=round(sum(seconds), 3) if seconds else None, lines=lines,
                               folded=[n for n in stage.states if n not in entered and n in known]))
    by_key = {v.key: v for v in views}
    for here, there in itertools.pairwise(stays):
        if there.stage.key not in by_key[here.stage.key].next_stages:
            by_key[here.stage.key].next_stages.append(there.stage.key)
    return views


# The stage picture: one column a stage, its head on top, the run's lines below it, the folded rest last.
COL_W, COL_GAP, HEAD_H, LINE_H, LINE_GAP, TOP = 176, 22, 46, 34, 10, 64


@dataclass
class Box:
    x: float
    y: float
    w: float
    h: float


def stage_boxes(views: Sequence[StageView]) -> tuple[dict[str, Box], dict[tuple[str, int], Box], dict[str, Box],
                                                     float, float]:
    """Where each stage's head, each of its lines and its folded box go; the picture's width and height."""
    heads: dict[str, Box] = {}
    lines: dict[tuple[str, int], Box] = {}
    folds: dict[str, Box] = {}
    bottom = TOP + HEAD_H
    for col, view in enumerate(views):
        x = MARGIN + col * (COL_W + COL_GAP)
        heads[view.key] = Box(x, TOP, COL_W, HEAD_H)
        y = TOP + HEAD_H + LINE_GAP * 2
        for i, _ in enumerate(view.lines):
            lines[(view.key, i)] = Box(x + 8, y, COL_W - 16, LINE_H)
            y += LINE_H + LINE_GAP
        if view.folded:
            folds[view.key] = Box(x + 8, y, COL_W - 16, LINE_H - 8)
            y += LINE_H
        bottom = max(bottom, y)
    width = MARGIN * 2 + len(views) * (COL_W + COL_GAP) - COL_GAP
    return heads, lines, folds, width, bottom + 56


def _short(text: str, limit: int = 25) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _stage_arc(a: Box, b: Box) -> str:
    """The run's way from one stage to another: beside each other a straight arrow, further apart an arc above."""
    if b.x == a.x + a.w + COL_GAP:
        return f"M{a.x + a.w:.0f},{a.y + a.h / 2:.0f} L{b.x:.0f},{b.y + b.h / 2:.0f}"
    x1, x2 = a.x + a.w / 2, b.x + b.w / 2
    lift = min(TOP - 8, 18 + abs(x2 - x1) / 30)
    return f"M{x1:.0f},{a.y:.0f} C{x1:.0f},{a.y - lift:.0f} {x2:.0f},{b.y - lift:.0f} {x2:.0f},{b.y:.0f}"


def render_svg(definition: dict[str, Any], history: list[dict[str, Any]], execution_status: str,
               title: str) -> str:
    status, _ = outcomes(definition, history, execution_status)
    views = stage_view(definition, steps_from_history(history, execution_status))
    heads, line_boxes, folds, width, height = stage_boxes(views)
    kinds = {name: state["Type"] for name, state in all_states(definition).items()}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
           "<defs>",
           '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#333"/></marker>',
           "</defs>", '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{MARGIN}" y="24" font-size="15" font-weight="bold">{html.escape(title)}</text>']
    legend_x = MARGIN
    for label in ("succeeded", "missed", "caught", "failed", "running", "not reached"):
        out.append(f'<rect x="{legend_x}" y="{height - 26:.0f}" width="12" height="12" fill="{FILLS[label]}" '
                   f'stroke="{COLOURS[label]}"/><text x="{legend_x + 16}" y="{height - 16:.0f}">{label}</text>')
        legend_x += 100
    for a, b in itertools.pairwise(views):  # the pipeline's order, faint
        ha, hb = heads[a.key], heads[b.key]
        out.append(f'<path d="M{ha.x + ha.w:.0f},{ha.y + ha.h / 2:.0f} L{hb.x:.0f},{hb.y + hb.h / 2:.0f}" '
                   'stroke="#e0e0e0" stroke-width="1" fill="none"/>')
    for view in views:  # the run's way, bold
        for target in view.next_stages:
            out.append(f'<path class="taken" d="{_stage_arc(heads[view.key], heads[target])}" fill="none" '
                       f'stroke="#333" stroke-width="2.2" marker-end="url(#arrow)"><title>{html.escape(view.title)} '
                       f'-&gt; {html.escape(heads_title(views, target))}</title></path>')
    drawn: set[str] = set()
    for view in views:
        head = heads[view.key]
        colour, fill = COLOURS[view.status], FILLS[view.status]
        took = f" \u00b7 {human_duration(view.seconds)}" if view.seconds is not None else ""
        out.append(f'<g class="stage" data-stage="{view.key}"><title>{html.escape(view.title)}: {view.status}'
                   f'{", " + human_duration(view.seconds) if view.seconds is not None else ""}</title>'
                   f'<rect x="{head.x:.0f}" y="{head.y:.0f}" width="{head.w:.0f}" height="{head.h:.0f}" rx="6" '
                   f'fill="{fill}" stroke="{colour}" stroke-width="{1 if view.status == "not reached" else 2.5}"/>'
                   f'<text x="{head.x + head.w / 2:.0f}" y="{head.y + 20:.0f}" text-anchor="middle" font-size="14" '
                   f'font-weight="bold">{html.escape(view.title)}</text>'
                   f'<text x="{head.x + head.w / 2:.0f}" y="{head.y + 37:.0f}" text-anchor="middle" font-size="11" '
                   f'fill="{colour}">{view.status}'
                   f'{took}</text></g>')
        previous = head
        for i, line in enumerate(view.lines):
            box = line_boxes[(view.key, i)]
            out.append(f'<path d="M{box.x + box.w / 2:.0f},{previous.y + previous.h:.0f} L{box.x + box.w / 2:.0f},'
                       f'{box.y:.0f}" stroke="#333" stroke-width="1.6" fill="none"/>')
            previous = box
            single = line.states[0] if len(line.states) == 1 and line.states[0] in kinds else None
            colour, fill = COLOURS[line.status], FILLS[line.status]
            detail = line.status + (f" \u00b7 {human_duration(line.seconds)}" if line.seconds is not None else "")
            tip = f"{line_title(line)}: {detail}" + (f" ({line.note})" if line.note else "") + (
                f" [{line.error}]" if line.error else "") + ("" if single else " \u2014 " + ", ".join(line.states))
            # every state has one group titled with its outcome (drawn here, or empty below)
            opening = (f"<g><title>{html.escape(single)} ({kinds[single]}): {status.get(single, 'not reached')}"
                       f"</title><title>{html.escape(tip)}</title>" if single and single not in drawn
                       else f'<g class="line"><title>{html.escape(tip)}</title>')
            if single:
                drawn.add(single)
            out.append(f'{opening}<rect x="{box.x:.0f}" y="{box.y:.0f}" width="{box.w:.0f}" height="{box.h:.0f}" '
                       f'rx="{14 if single and kinds[single] in ("Succeed", "Fail") else 4}" fill="{fill}" '
                       f'stroke="{colour}" stroke-width="1.5"/>'
                       f'<text x="{box.x + box.w / 2:.0f}" y="{box.y + 14:.0f}" text-anchor="middle" font-size="11">'
                       f'{html.escape(_short(line_title(line)))}</text>'
                       f'<text x="{box.x + box.w / 2:.0f}" y="{box.y + 27:.0f}" text-anchor="middle" font-size="10" '
                       f'fill="{colour}">{html.escape(detail)}</text></g>')
        if view.key in folds:
            box = folds[view.key]
            out.append(f'<g class="folded"><title>not reached: {html.escape(", ".join(view.folded))}</title>'
                       f'<rect x="{box.x:.0f}" y="{box.y:.0f}" width="{box.w:.0f}" height="{box.h:.0f}" rx="4" '
                       f'fill="#fafafa" stroke="#bdbdbd" stroke-dasharray="4,3"/>'
                       f'<text x="{box.x + box.w / 2:.0f}" y="{box.y + 17:.0f}" text-anchor="middle" font-size="10" '
                       f'fill="#757575">+{len(view.folded)} not reached</text></g>')
    for name, kind in kinds.items():  # the states inside a loop's box or folded away: named, not drawn
        if name not in drawn:
            out.append(f"<g><title>{html.escape(name)} ({kind}): {status.get(name, 'not reached')}</title></g>")
    out.append("</svg>")
    return "\n".join(out)


def heads_title(views: Sequence[StageView], key: str) -> str:
    return next(v.title for v in views if v.key == key)


def render_png(definition: dict[str, Any], history: list[dict[str, Any]], execution_status: str, title: str,
               path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    views = stage_view(definition, steps_from_history(history, execution_status))
    heads, line_boxes, folds, width, height = stage_boxes(views)
    fig = plt.figure(figsize=(width / 100, height / 100), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    ax.text(MARGIN, 24, title, fontsize=11, weight="bold")

    def box(b: Box, status: str, dashed: bool = False) -> None:
        ax.add_patch(FancyBboxPatch((b.x, b.y), b.w, b.h, boxstyle="round,pad=0,rounding_size=5",
                                    facecolor=FILLS[status], edgecolor=COLOURS[status], lw=1.5,
                                    linestyle="--" if dashed else "-"))

    for view in views:
        for target in view.next_stages:
            a, b = heads[view.key], heads[target]
            ax.annotate("", xy=(b.x + b.w / 2, b.y), xytext=(a.x + a.w / 2, a.y),
                        arrowprops={"arrowstyle": "->", "color": "#333", "lw": 2,
                                    "connectionstyle": "arc3,rad=-0.25"})
        head = heads[view.key]
        box(head, view.status)
        ax.text(head.x + head.w / 2, head.y + 17, view.title, ha="center", va="center", fontsize=10, weight="bold")
        ax.text(head.x + head.w / 2, head.y + 34, view.status + (
            f" \u00b7 {human_duration(view.seconds)}" if view.seconds is not None else ""),
            ha="center", va="center", fontsize=8, color=COLOURS[view.status])
        for i, line in enumerate(view.lines):
            b = line_boxes[(view.key, i)]
            box(b, line.status)
            ax.text(b.x + b.w / 2, b.y + 12, _short(line_title(line)), ha="center", va="center", fontsize=7.5)
            ax.text(b.x + b.w / 2, b.y + 25, line.status + (
                f" \u00b7 {human_duration(line.seconds)}" if line.seconds is not None else ""),
                ha="center", va="center", fontsize=7, color=COLOURS[line.status])
        if view.key in folds:
            b = folds[view.key]
            box(b, "not reached", dashed=True)
            ax.text(b.x + b.w / 2, b.y + b.h / 2, f"+{len(view.folded)} not reached", ha="center", va="center",
                    fontsize=7, color="#757575")
    fig.savefig(path)
    plt.close(fig)


def write_graph(definition: dict[str, Any], history: list[dict[str, Any]], execution_status: str, title: str,
                path: Path) -> Path:
    """Write the picture to ``path`` (.svg or .png), atomically."""
    suffix = path.suffix.lower()
    if suffix not in (".svg", ".png"):
        raise ValueError(f"{path}: the graph is written as .svg or .png, not {suffix or 'no suffix'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{suffix}")
    if suffix == ".svg":
        tmp.write_text(render_svg(definition, history, execution_status, title), encoding="utf-8")
    else:
        render_png(definition, history, execution_status, title, tmp)
    tmp.replace(path)
    return path
