"""One policy, one look, in every figure.

Why a fixed mapping and not matplotlib's colour cycle: the cycle hands out colours in plotting
order, so ``hw-aware`` would be blue in one figure and orange in the next. Here the style is a
pure function of the policy string. Colours are Okabe-Ito (safe for the common forms of colour
blindness); a family that appears with several arguments (``static:2``, ``static:4``) keeps its
hue and changes shade, marker and dash, decided by the argument alone.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

# Okabe & Ito (2008), "Color Universal Design".
OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
    "grey": "#7F7F7F",
}


@dataclass(frozen=True)
class Style:
    """How one policy is drawn: ``ax.plot(x, y, **style.kwargs())``."""

    color: str
    marker: str
    linestyle: str

    def kwargs(self) -> dict[str, str]:
        return {"color": self.color, "marker": self.marker, "linestyle": self.linestyle}

    @property
    def hatch(self) -> str:
        """Bars have no dashes: a hatch tells apart families that share a hue."""
        return _HATCH.get(self.linestyle, "")


# Built-in policy families. yellow is kept for bars only (too light for thin lines on white),
# so no family owns it.
_FAMILY: dict[str, Style] = {
    "ar": Style(OKABE_ITO["grey"], "x", ":"),
    "mtp1": Style(OKABE_ITO["orange"], "s", "-"),
    "static": Style(OKABE_ITO["sky_blue"], "v", "--"),
    "full": Style(OKABE_ITO["reddish_purple"], "^", "--"),
    "threshold": Style(OKABE_ITO["bluish_green"], "D", "-."),
    # wine (Tol): its own hue, so it never reads as threshold's twin
    "cum-threshold": Style("#882255", "d", ":"),
    "hw-aware": Style(OKABE_ITO["blue"], "o", "-"),
    # olive (Tol), dashed: the lossy variant must not pass for hw-aware (labels add "(lossy)")
    "hw-aware-global": Style("#999933", "P", "--"),
    "zos": Style(OKABE_ITO["vermillion"], "*", "-"),
    "goodput": Style("#8C564B", "h", "-."),  # brown: outside Okabe-Ito but distinct in CVD sims
    "oracle": Style(OKABE_ITO["black"], "", ":"),
    # issue #16's policy and its alias: indigo (Tol), outside Okabe-Ito but distinct from all
    "calibrated-zos": Style("#332288", "p", "-"),
    "auto": Style("#332288", "p", "-"),
    # the engines' own rules (issue #47; specsim.policies.engines): Tol's remaining hues, each
    # its own marker, so they never pass for full (reddish purple) or one another
    "vllm-adaptive": Style("#CC6677", "<", "-"),  # rose
    "trtllm-confidence": Style("#44AA99", ">", "-"),  # teal
    "trtllm-schedule": Style("#AA4499", ">", "--"),  # purple (Tol)
    "sglang-dspark": Style("#88CCEE", "8", "--"),  # cyan
    "llama-dspark": Style("#117733", "H", "-."),  # green, dash-dot: apart from threshold's D
    # the ZOS report's variants (specsim.analysis.variants)
    "zos-serial": Style(OKABE_ITO["vermillion"], "v", "--"),
    "fresh-overlapped": Style(OKABE_ITO["black"], "X", ":"),
}
_HATCH = {"-": "", "--": "////", ":": "....", "-.": "xxx"}
_OTHER = [OKABE_ITO[k] for k in ("blue", "vermillion", "bluish_green", "reddish_purple", "orange")]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
_DASHES = ["-", "--", "-.", ":"]


def _shade(hex_color: str, factor: float) -> str:
    """Darken (factor < 0) or lighten (factor > 0) a colour by mixing with black or white."""
    rgb = [int(hex_color[i : i + 2], 16) for i in (1, 3, 5)]
    target = 255 if factor > 0 else 0
    f = abs(factor)
    mixed = [round(c + (target - c) * f) for c in rgb]
    return "#" + "".join(f"{c:02X}" for c in mixed)


def _h(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def policy_style(policy: str) -> Style:
    """The fixed style of a policy spec such as ``"hw-aware"`` or ``"static:3"``."""
    family, sep, arg = policy.partition(":")
    base = _FAMILY.get(family)
    if base is None:  # a user's module:callable or an unknown name: stable, hashed pick
        h = _h(policy)
        return Style(_OTHER[h % len(_OTHER)], _MARKERS[(h // 7) % len(_MARKERS)], "-.")
    if not sep:
        return base
    h = _h(arg)
    shade = (-0.35, 0.0, 0.3)[h % 3]
    return Style(
        _shade(base.color, shade) if shade else base.color,
        _MARKERS[(h // 3) % len(_MARKERS)],
        _DASHES[(h // 24) % len(_DASHES)],
    )


# One order everywhere (legends, bars, tables): baselines first, then the schedulers from the
# simplest to the paper's, the bound last; a family's arguments in ascending order.
POLICY_ORDER = (
    "ar", "mtp1", "static", "full", "threshold", "cum-threshold", "goodput", "hw-aware",
    "hw-aware-global", "zos-serial", "zos", "fresh-overlapped", "calibrated-zos", "auto",
    "vllm-adaptive", "trtllm-confidence", "trtllm-schedule", "sglang-dspark", "llama-dspark",
    "oracle",
)  # fmt: skip


def policy_order(policies: list[str]) -> list[str]:
    """``policies`` (unique) in the shared order; user policies keep their order, after these."""
    rank = {f: i for i, f in enumerate(POLICY_ORDER)}

    def key(item: tuple[int, str]) -> tuple[int, float, int]:
        pos, p = item
        family, _, arg = p.partition(":")
        try:
            num = float(arg) if arg else -1.0
        except ValueError:
            num = 0.0
        return (rank.get(family, len(rank)), num if family in rank else 0.0, pos)

    return [p for _, p in sorted(enumerate(dict.fromkeys(policies)), key=key)]


def policy_label(policy: str) -> str:
    """The legend text of a policy: its spec, with " (lossy)" when it does not keep the target's
    output distribution, so a lossy curve that looks like a winner is read as what it is."""
    try:
        from specsim.policies.base import get_policy

        lossless = get_policy(policy).lossless
    except Exception:  # noqa: BLE001 - a name only a report knows (zos-serial): no claim to add
        return policy
    return policy if lossless else f"{policy} (lossy)"
