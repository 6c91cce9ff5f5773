"""A picture of the state machine with each state's outcome in one run (SVG, or PNG via matplotlib).

States are laid out in rows by their distance from ``StartAt`` (transitions through Next,
Default, Choices and Catch), boxes coloured by what happened to them in the run's history:
succeeded, failed (an error the run ended on, or a Fail state reached), caught (failed, then
routed on by a Catch), running, or not reached. Transitions the run took are drawn bold.
No graphviz binary is needed: the layout is computed here and written as plain SVG.
Standard library only (matplotlib only for PNG): `d2ops graph` and the status API's
``GET /runs/{runId}/graph`` (through the CoreLayer) share this layout.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COLOURS = {"succeeded": "#2e7d32", "failed": "#c62828", "caught": "#ef6c00", "running": "#1565c0",
           "not reached": "#9e9e9e"}
FILLS = {"succeeded": "#e8f5e9", "failed": "#ffebee", "caught": "#fff3e0", "running": "#e3f2fd",
         "not reached": "#fafafa"}
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
    """Each top-level state's outcome in the run, and the transitions it took."""
    states = definition["States"]
    status: dict[str, str] = {}
    taken: set[tuple[str, str]] = set()
    previous: str | None = None
    current: str | None = None
    for event in history:
        kind = event["type"]
        if kind.endswith("StateEntered"):
            name = event["stateEnteredEventDetails"]["name"]
            if name not in states:
                continue  # a state inside a Map or Parallel branch
            if previous is not None:
                taken.add((previous, name))
            current = name
            status[name] = "failed" if states[name]["Type"] == "Fail" else "running"
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


def _edge_path(a: Node, b: Node) -> str:
    x1, y1 = a.x + BOX_W / 2, a.y + BOX_H
    x2, y2 = b.x + BOX_W / 2, b.y
    if y2 > y1:
        mid = (y1 + y2) / 2
        return f"M{x1:.0f},{y1:.0f} C{x1:.0f},{mid:.0f} {x2:.0f},{mid:.0f} {x2:.0f},{y2:.0f}"
    # A loop back up (an endpoint wait loop): around the right-hand side of the boxes.
    xr = max(a.x, b.x) + BOX_W + GAP_X / 2
    return (f"M{a.x + BOX_W:.0f},{a.y + BOX_H / 2:.0f} C{xr:.0f},{a.y + BOX_H / 2:.0f} {xr:.0f},"
            f"{b.y + BOX_H / 2:.0f} {b.x + BOX_W:.0f},{b.y + BOX_H / 2:.0f}")


def render_svg(definition: dict[str, Any], history: list[dict[str, Any]], execution_status: str,
               title: str) -> str:
    status, taken = outcomes(definition, history, execution_status)
    nodes, edges = layout(definition, status, taken)
    by_name = {n.name: n for n in nodes}
    width = max(n.x for n in nodes) + BOX_W + MARGIN * 2
    height = max(n.y for n in nodes) + BOX_H + MARGIN * 2 + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
           "<defs>",
           '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker>',
           '<marker id="arrow-dim" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#ccc"/></marker>',
           "</defs>", '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{MARGIN}" y="{height - 30:.0f}" font-size="14" font-weight="bold">{html.escape(title)}</text>']
    legend_x = MARGIN
    for label, colour in COLOURS.items():
        out.append(f'<rect x="{legend_x}" y="{height - 20:.0f}" width="12" height="12" fill="{FILLS[label]}" '
                   f'stroke="{colour}"/><text x="{legend_x + 16}" y="{height - 10:.0f}">{label}</text>')
        legend_x += 110
    for edge in sorted(edges, key=lambda e: e.taken):  # taken edges drawn last, on top
        a, b = by_name[edge.source], by_name[edge.target]
        style = ('stroke="#333" stroke-width="2.2" marker-end="url(#arrow)"' if edge.taken
                 else 'stroke="#d0d0d0" stroke-width="1" marker-end="url(#arrow-dim)"')
        dash = ' stroke-dasharray="5,3"' if edge.kind == "catch" else ""
        out.append(f'<path d="{_edge_path(a, b)}" fill="none" {style}{dash}>'
                   f"<title>{html.escape(edge.source)} -&gt; {html.escape(edge.target)} ({edge.kind})</title></path>")
    for node in nodes:
        colour, fill = COLOURS[node.status], FILLS[node.status]
        rx = 18 if node.kind in ("Succeed", "Fail") else 4
        label = node.name if len(node.name) <= 28 else node.name[:26] + "..."
        out.append(f'<g><title>{html.escape(node.name)} ({node.kind}): {node.status}</title>'
                   f'<rect x="{node.x:.0f}" y="{node.y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="{rx}" '
                   f'fill="{fill}" stroke="{colour}" stroke-width="{2 if node.status != "not reached" else 1}"/>'
                   f'<text x="{node.x + BOX_W / 2:.0f}" y="{node.y + 17:.0f}" text-anchor="middle" '
                   f'fill="#212121">{html.escape(label)}</text>'
                   f'<text x="{node.x + BOX_W / 2:.0f}" y="{node.y + 31:.0f}" text-anchor="middle" font-size="10" '
                   f'fill="{colour}">{node.kind} - {node.status}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def render_png(definition: dict[str, Any], history: list[dict[str, Any]], execution_status: str, title: str,
               path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    status, taken = outcomes(definition, history, execution_status)
    nodes, edges = layout(definition, status, taken)
    by_name = {n.name: n for n in nodes}
    width = max(n.x for n in nodes) + BOX_W + MARGIN * 2
    height = max(n.y for n in nodes) + BOX_H + MARGIN * 2 + 20
    fig = plt.figure(figsize=(width / 100, height / 100), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    for edge in sorted(edges, key=lambda e: e.taken):
        a, b = by_name[edge.source], by_name[edge.target]
        ax.annotate("", xy=(b.x + BOX_W / 2, b.y), xytext=(a.x + BOX_W / 2, a.y + BOX_H),
                    arrowprops={"arrowstyle": "->", "color": "#333" if edge.taken else "#d0d0d0",
                                "lw": 2 if edge.taken else 0.8, "linestyle": "--" if edge.kind == "catch" else "-",
                                "connectionstyle": "arc3,rad=0.0" if b.y > a.y else "arc3,rad=-0.4"})
    for node in nodes:
        ax.add_patch(FancyBboxPatch((node.x, node.y), BOX_W, BOX_H, boxstyle="round,pad=0,rounding_size=6",
                                    facecolor=FILLS[node.status], edgecolor=COLOURS[node.status], lw=1.5))
        ax.text(node.x + BOX_W / 2, node.y + 16, node.name[:28], ha="center", va="center", fontsize=8)
        ax.text(node.x + BOX_W / 2, node.y + 30, f"{node.kind} - {node.status}", ha="center", va="center",
                fontsize=7, color=COLOURS[node.status])
    ax.text(MARGIN, height - 14, title, fontsize=10, weight="bold")
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
