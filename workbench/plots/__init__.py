"""Plots: pure functions from results (or arrays) to plotly Figures; they never run an engine.

Import the submodules (``workbench.plots.compare``, ...) directly: this package imports nothing heavy.
"""

from __future__ import annotations

import html


def esc(text: object) -> str:
    """``text`` for a plotly string (title, annotation, legend name, tick or hover label): plotly reads a subset of
    HTML there (``<a href>``, ``<b>``, ``<br>``), so a model's node called ``<a href=...>`` would become a live
    link. ``<``, ``>`` and ``&`` are escaped; plotly shows the characters themselves."""
    return html.escape(str(text), quote=False)


#: a title line holds at most this many characters: a figure 400 px wide fits it at 14 px
TITLE_CHARS = 56
#: category tick labels (node, tensor names) longer than this are shortened in the middle (full name in hover)
LABEL_CHARS = 42


def wrap_text(text: str, width: int = TITLE_CHARS) -> list[str]:
    """``text`` in lines of at most ``width`` characters. A text that does not fit is first broken after its
    subject (``"/a/b_output_0: value distributions"``: the name, then what is shown), then between words, keeping a
    parenthesised group whole when it fits a line; a longer word (a tensor path) is broken after a ``/``, ``_``,
    ``.`` or ``:`` (else anywhere). Nothing is cut off."""
    text = str(text)
    if len(text) <= width:
        return [text]
    head, sep, tail = text.partition(": ")
    if sep and "(" not in head and width // 3 < len(head) < len(text) - 2:
        return _pack([head + ":"], width) + _pack(_units(tail), width)
    return _pack(_units(text), width)


def _units(text: str) -> list[str]:
    """Words, with a parenthesised group (``(fp32 vs fp16)``) as one unit."""
    units: list[str] = []
    depth = 0
    for word in text.split(" "):
        if depth > 0 and units:
            units[-1] += " " + word
        else:
            units.append(word)
        depth = max(0, depth + word.count("(") - word.count(")"))
    return units


def _pack(units: list[str], width: int) -> list[str]:
    lines: list[str] = []
    line = ""
    for unit in units:
        pieces = [unit] if len(unit) <= width else unit.split(" ")  # a group too long for a line: its words
        for word in pieces:
            if line and len(line) + 1 + len(word) <= width:
                line = f"{line} {word}"
                continue
            if line:
                lines.append(line)
            line = ""
            while len(word) > width:  # a long name: break it after a separator near the end of the line
                cut = max(word.rfind(sep, 0, width) for sep in "/_.:") + 1
                cut = cut if cut >= width // 2 else width
                lines.append(word[:cut])
                word = word[cut:]
            line = word
    if line or not lines:
        lines.append(line)
    return lines


def short_label(text: str, width: int = LABEL_CHARS) -> str:
    """``text`` shortened in the middle to ``width`` characters ("/encoder/layer.3/…/MatMul_output_0")."""
    text = str(text)
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "\u2026" + text[len(text) - (width - 1 - head):]


def short_labels(texts: list[str], width: int = LABEL_CHARS) -> list[str]:
    """:func:`short_label` of each, kept distinct (plotly merges equal category labels into one bar)."""
    out: list[str] = []
    seen: set[str] = set()
    for text in texts:
        label = short_label(text, width)
        k = 2
        while label in seen:
            suffix = f" #{k}"
            label = short_label(text, width - len(suffix)) + suffix
            k += 1
        seen.add(label)
        out.append(label)
    return out


def fit_title(fig, width: int = TITLE_CHARS):
    """Wrap ``fig``'s title into lines of ``width`` characters, at 14 px, left-aligned, pushing the top margin as
    far as its lines need (plotly clips a title wider than the figure rather than wrapping it). Returns ``fig``."""
    title = fig.layout.title
    text = title.text if title is not None else None
    if not text:
        return fig
    lines = wrap_text(text.replace("<br>", " "), width)
    # plotly anchors a multi-line title by its middle line: the top padding moves its first line into view
    pad = 6 + 14 * (len(lines) - 1)
    fig.update_layout(title={"text": "<br>".join(lines), "font": {"size": 14}, "x": 0.01, "xanchor": "left",
                             "y": 1, "yanchor": "top", "yref": "container", "pad": {"t": pad}, "automargin": True})
    top = fig.layout.margin.t if fig.layout.margin.t is not None else 60
    fig.update_layout(margin={"t": max(top, 30 + 19 * len(lines))})
    return fig
