"""The global model's accuracy per round as an SVG line chart (no plotting library needed),
with optional horizontal lines for comparison (each board trained alone, say)."""
from __future__ import annotations

from xml.sax.saxutils import escape


def accuracy_svg(history, path, lines=(), title="global accuracy per round", width=560, height=320):
    """history: [{"round", "accuracy"}, ...]; lines: [(label, value)] drawn across."""
    pts = [(h["round"], h["accuracy"]) for h in history if h.get("accuracy") is not None]
    if not pts:
        return None
    left, right, top, bottom = 50, 190, 30, 40
    w, h = width - left - right, height - top - bottom
    r_max = max(1, max(r for r, _ in pts))
    vals = [a for _, a in pts] + [v for _, v in lines]
    lo = min(0.0, min(vals))
    hi = max(1.0, max(vals))

    def X(r):
        return left + w * r / r_max

    def Y(v):
        return top + h * (1 - (v - lo) / (hi - lo))

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">'
           % (width, height), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18" font-size="13">%s</text>' % (left, escape(title))]
    for k in range(6):
        v = lo + (hi - lo) * k / 5
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' % (left, left + w, Y(v), Y(v)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%.1f</text>' % (left - 6, Y(v) + 4, v))
    for r in range(0, r_max + 1, max(1, r_max // 10)):
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (X(r), top + h + 16, r))
    out.append('<text x="%.1f" y="%d" text-anchor="middle">round</text>' % (left + w / 2, top + h + 32))
    colours = ["#c0392b", "#8e44ad", "#16a085", "#d35400", "#2c3e50", "#7f8c8d"]
    for i, (label, v) in enumerate(lines):
        c = colours[i % len(colours)]
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="4 3"/>'
                   % (left, left + w, Y(v), Y(v), c))
        out.append('<text x="%d" y="%.1f" fill="%s">%s %.3f</text>' % (left + w + 6, Y(v) + 4, c, escape(label), v))
    path_d = " ".join("%s%.1f,%.1f" % ("M" if i == 0 else "L", X(r), Y(a)) for i, (r, a) in enumerate(pts))
    out.append('<path d="%s" fill="none" stroke="#2471a3" stroke-width="2"/>' % path_d)
    for r, a in pts:
        out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="#2471a3"/>' % (X(r), Y(a)))
    r, a = pts[-1]
    out.append('<text x="%d" y="%.1f" fill="#2471a3">fleet %.3f</text>' % (left + w + 6, Y(a) - 8, a))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return path
