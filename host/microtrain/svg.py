"""The arena as a picture: op index across, arena offset down, one box per tensor."""
from __future__ import annotations

from html import escape

COLORS = {"FORWARD": "#4e79a7", "TRAIN": "#e15759", "INPUT": "#59a14f"}


def arena_svg(report, width=900, height=420):
    tensors = [t for t in report["tensors"] if t["storage"] == "arena" and t["first"] >= 0]
    n_ops = max(1, report["ops"])
    arena = max(1, report["arena_bytes"])
    left, top, right, bottom = 70, 40, 20, 40
    w, h = width - left - right, height - top - bottom
    x = lambda k: left + w * k / n_ops          # noqa: E731
    y = lambda off: top + h * off / arena       # noqa: E731
    fwd = report["ops_by_phase"].get("forward", 0)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="11">' % (width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="20" font-size="14">arena %d B planned (naive %d B, peak live %d B), %d ops</text>'
           % (left, report["arena_bytes"], report["naive_bytes"], report["peak_live_bytes"], report["ops"]),
           '<rect x="%d" y="%d" width="%.1f" height="%d" fill="#f3f3f3"/>' % (left, top, x(fwd) - left, h)]
    # a view or an op run in place uses its owner's memory: draw each owner's block once, over the
    # whole time any of its tensors lives
    blocks = {}
    for t in tensors:
        b = blocks.setdefault(t["memory_of"] or t["name"], {"off": t["offset"], "size": 0, "first": t["first"],
                                                           "last": t["last"], "names": [], "grad": True})
        b["size"] = max(b["size"], t["bytes"])
        b["first"], b["last"] = min(b["first"], t["first"]), max(b["last"], t["last"])
        b["names"].append(t["name"])
        b["grad"] = b["grad"] and t["name"].startswith("d(")
    blocks = sorted(blocks.values(), key=lambda b: (b["off"], b["first"]))
    for b in blocks:
        off, size = b["off"], b["size"]
        bw = max(2.0, x(b["last"] + 1) - x(b["first"]))
        bh = max(1.0, y(off + size) - y(off))
        names = " = ".join(b["names"])
        out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="0.8" '
                   'stroke="#333" stroke-width="0.5"><title>%s: %d B at %d, ops %d-%d</title></rect>'
                   % (x(b["first"]), y(off), bw, bh, COLORS["TRAIN"] if b["grad"] else COLORS["FORWARD"],
                      escape(names), size, off, b["first"], b["last"]))
        label = b["names"][-1]
        if bh >= 12 and bw >= 7 * min(len(label), 24):
            out.append('<text x="%.1f" y="%.1f" fill="white">%s</text>' % (x(b["first"]) + 3, y(off) + 12,
                                                                           escape(label[-24:])))
    for k in range(0, n_ops + 1, max(1, n_ops // 20)):
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (x(k), top + h + 14, k))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (left, top + h, left + w, top + h))
    out.append('<text x="%d" y="%d">op index (grey band: forward ops; blue: activations; red: gradients; '
               'hover a box for its tensors)</text>' % (left, height - 8))
    out.append('<text x="12" y="%d" transform="rotate(-90 12 %d)">arena offset</text>' % (top + h // 2, top + h // 2))
    for frac in (0, 0.5, 1):
        out.append('<text x="%d" y="%.1f" text-anchor="end">%d</text>' % (left - 4, y(arena * frac) + 4, arena * frac))
    out.append("</svg>")
    return "\n".join(out) + "\n"
