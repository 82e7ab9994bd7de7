"""A small SVG line plot for the benchmark scripts: no plotting library to install.

plot(path, title, xlabel, series, lines, logx) writes an SVG file:
  series: [(label, colour, dash, [(x, y), ...])]  -- y in ms; x > 0 when logx (0 is drawn
          at the left edge, labelled "0")
  lines:  [(label, colour, y)]                     -- horizontal reference lines
"""

import math

W, H = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 40, 50


def _nice_max(v):
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def plot(path, title, xlabel, series, lines=(), logx=True, logy=False):
    xs = sorted({x for _, _, _, pts in series for x, _ in pts})
    ys = [y for _, _, _, pts in series for _, y in pts] + [y for _, _, y in lines]
    ymax = _nice_max(max(ys) * 1.05)
    ylo = math.floor(math.log10(max(min(ys), 1e-3)))
    yhi = math.ceil(math.log10(max(ys)))
    if yhi <= ylo:
        yhi = ylo + 1
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    pos = [x for x in xs if x > 0]
    lo = math.log10(min(pos)) - 0.5 if pos else 0.0
    hi = math.log10(max(pos)) if pos else 1.0
    if hi <= lo:
        hi = lo + 1

    def sx(x):
        if not logx:
            return LEFT + pw * x / (max(xs) or 1)
        if x <= 0:
            return LEFT
        return LEFT + pw * (math.log10(x) - lo) / (hi - lo)

    def sy(y):
        if logy:
            return TOP + ph * (1 - (math.log10(max(y, 1e-3)) - ylo) / (yhi - ylo))
        return TOP + ph * (1 - y / ymax)

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="12">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>' % (LEFT, title)]
    yticks = ([m * 10 ** e for e in range(ylo, yhi) for m in (1, 2, 5)] + [10 ** yhi]
              if logy else [ymax * i / 5 for i in range(6)])
    for y in yticks:
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' %
                   (LEFT, LEFT + pw, sy(y), sy(y)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (LEFT - 6, sy(y) + 4, y))
    for x in xs:
        out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eee"/>' %
                   (sx(x), sx(x), TOP, TOP + ph))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' %
                   (sx(x), TOP + ph + 16, "{:,}".format(x)))
    out.append('<text x="%d" y="%d" text-anchor="middle">%s</text>' %
               (LEFT + pw // 2, H - 10, xlabel))
    out.append('<text transform="translate(16,%d) rotate(-90)" text-anchor="middle">'
               'median ms per call%s</text>' % (TOP + ph // 2, " (log scale)" if logy else ""))
    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>' %
               (LEFT, TOP, pw, ph))
    legend = []
    for label, colour, y in lines:
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="1.5" '
                   'stroke-dasharray="2,3"/>' % (LEFT, LEFT + pw, sy(y), sy(y), colour))
        legend.append((label, colour, "2,3"))
    for label, colour, dash, pts in series:
        d = " ".join("%.1f,%.1f" % (sx(x), sy(y)) for x, y in sorted(pts))
        out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>' %
                   (d, colour, ' stroke-dasharray="%s"' % dash if dash else ""))
        for x, y in pts:
            out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (sx(x), sy(y), colour))
        legend.append((label, colour, dash))
    for i, (label, colour, dash) in enumerate(legend):
        y = TOP + 10 + 18 * i
        x = LEFT + pw + 12
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>' %
                   (x, x + 24, y, y, colour, ' stroke-dasharray="%s"' % dash if dash else ""))
        out.append('<text x="%d" y="%d">%s</text>' % (x + 30, y + 4, label))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def bars(path, title, groups, colours, ylabel="median ms per call"):
    """A grouped bar chart: groups = [(group label, [(bar label, value), ...])]; a bar label's
    colour comes from `colours`, and each bar is labelled with its value; `ylabel` names the
    values' unit."""
    labels = []
    for _, items in groups:
        for label, _ in items:
            if label not in labels:
                labels.append(label)
    ymax = _nice_max(max(v for _, items in groups for _, v in items) * 1.1)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="12">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>' % (LEFT, title)]

    def sy(y):
        return TOP + ph * (1 - y / ymax)

    for i in range(6):
        y = ymax * i / 5
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' %
                   (LEFT, LEFT + pw, sy(y), sy(y)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (LEFT - 6, sy(y) + 4, y))
    out.append('<text transform="translate(16,%d) rotate(-90)" text-anchor="middle">'
               '%s</text>' % (TOP + ph // 2, ylabel))
    gw = pw / len(groups)
    bw = gw * 0.8 / len(labels)
    for g, (group, items) in enumerate(groups):
        x0 = LEFT + g * gw + gw * 0.1
        for label, value in items:
            x = x0 + labels.index(label) * bw
            out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>' %
                       (x, sy(value), bw - 4, TOP + ph - sy(value), colours[label]))
            out.append('<text x="%.1f" y="%.1f" text-anchor="middle">%.1f</text>' %
                       (x + (bw - 4) / 2, sy(value) - 4, value))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' %
                   (LEFT + g * gw + gw / 2, TOP + ph + 18, group))
    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>' %
               (LEFT, TOP, pw, ph))
    for i, label in enumerate(labels):
        y = TOP + 10 + 18 * i
        x = LEFT + pw + 12
        out.append('<rect x="%d" y="%d" width="14" height="10" fill="%s"/>' %
                   (x, y - 5, colours[label]))
        out.append('<text x="%d" y="%d">%s</text>' % (x + 20, y + 4, label))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
