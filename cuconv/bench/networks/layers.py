"""A network's conv layers as data: :class:`Layer` (one conv2d, with how often a forward pass runs it)
and :class:`Network` (the layers in forward order, identical ones merged).

The network modules (:mod:`.classifiers`, :mod:`.diffusion`, :mod:`.yolo`) write each conv of a
forward pass with :func:`conv`, in the order the forward pass runs it; :func:`network` merges every
repetition of the same geometry into one :class:`Layer` whose ``count`` is the number of times the
pass runs it (kept at its first position), so a network's total is ``sum(count * time per call)``.
Only convolutions are listed: pooling, normalisation, attention and linear layers are not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple, Union

__all__ = ["Layer", "Network", "conv", "network"]


@dataclass(frozen=True)
class Layer:
    """One conv2d of a network (NHWC input ``(N, H, W, C)``, filter ``(K, R, S, C // groups)``,
    symmetric zero padding), run ``count`` times per forward pass."""

    name: str
    N: int
    H: int
    W: int
    C: int
    K: int
    R: int
    S: int
    stride: int = 1
    pad: int = 0
    dilation: int = 1
    groups: int = 1
    count: int = 1

    @property
    def P(self) -> int:
        """Output height."""
        return (self.H + 2 * self.pad - self.dilation * (self.R - 1) - 1) // self.stride + 1

    @property
    def Q(self) -> int:
        """Output width."""
        return (self.W + 2 * self.pad - self.dilation * (self.S - 1) - 1) // self.stride + 1

    @property
    def macs(self) -> int:
        """Multiply-accumulates of one call: N * P * Q * K * R * S * C / groups."""
        return self.N * self.P * self.Q * self.K * self.R * self.S * (self.C // self.groups)

    @property
    def geometry(self) -> Tuple[int, ...]:
        """Everything but the name and count: two layers with equal geometry are the same problem."""
        return (self.N, self.H, self.W, self.C, self.K, self.R, self.S, self.stride, self.pad, self.dilation,
                self.groups)

    @property
    def kind(self) -> str:
        """``"dense"`` (one group), ``"depthwise"`` (a group per input channel, any channel multiplier
        ``K / C``) or ``"grouped"`` (the others)."""
        if self.groups == 1:
            return "dense"
        return "depthwise" if self.groups == self.C else "grouped"

    def min_bytes(self, itemsize: int) -> int:
        """The least memory traffic of one call: input, filter and output once each, ``itemsize``
        bytes an element (the depthwise layers' bandwidth is this over the time of a call)."""
        return itemsize * (self.N * self.H * self.W * self.C + self.K * self.R * self.S * (self.C // self.groups)
                           + self.N * self.P * self.Q * self.K)

    def describe(self) -> str:
        """``"C64 56x56 -> K256 1x1 s1 p0"`` (plus dilation and groups where they are not 1)."""
        text = f"C{self.C} {self.H}x{self.W} -> K{self.K} {self.R}x{self.S} s{self.stride} p{self.pad}"
        if self.dilation != 1:
            text += f" d{self.dilation}"
        if self.groups != 1:
            text += f" g{self.groups}"
        return text

    def to_json(self) -> Dict[str, int]:
        """The geometry as a dict (name and count left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("name", "count")}


def conv(name: str, hw: Union[int, Tuple[int, int]], C: int, K: int, f: int, stride: int = 1,
         pad: Union[int, None] = None, groups: int = 1, count: int = 1) -> Layer:
    """One conv of a forward pass, batch left for :func:`network` to fill: input ``hw`` (side, or
    ``(H, W)``), ``C`` -> ``K`` channels, an ``f x f`` filter, padding ``f // 2`` unless given."""
    H, W = (hw, hw) if isinstance(hw, int) else hw
    return Layer(name=name, N=0, H=H, W=W, C=C, K=K, R=f, S=f, stride=stride,
                 pad=f // 2 if pad is None else pad, groups=groups, count=count)


@dataclass(frozen=True)
class Network:
    """A network's conv layers in forward order, each geometry once with its count.

    ``source`` names the definition the list is written from; ``input`` is the network's input
    ``(H, W, C)`` at the benchmark's size; ``batch`` the N of every layer.
    """

    name: str
    title: str
    source: str
    batch: int
    input: Tuple[int, int, int]
    layers: Tuple[Layer, ...]

    @property
    def conv_layers(self) -> int:
        """Convolutions one forward pass runs (the sum of the counts)."""
        return sum(layer.count for layer in self.layers)

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the conv layers of one forward pass."""
        return sum(layer.count * layer.macs for layer in self.layers)


def network(name: str, title: str, source: str, batch: int, input: Tuple[int, int, int],
            convs: Sequence[Layer]) -> Network:
    """A :class:`Network` of the convs of a forward pass (from :func:`conv`), with batch ``batch``;
    a geometry that recurs is merged into its first occurrence, the counts added, and its name
    says how many other places of the list run it (``"layer3.1-5.conv2 (+1 more)"``)."""
    merged: Dict[Tuple[int, ...], Layer] = {}
    sites: Dict[Tuple[int, ...], int] = {}
    for c in convs:
        layer = dataclasses.replace(c, N=batch)
        first = merged.get(layer.geometry)
        merged[layer.geometry] = layer if first is None else dataclasses.replace(first,
                                                                                 count=first.count + layer.count)
        sites[layer.geometry] = sites.get(layer.geometry, 0) + 1
    layers = tuple(layer if sites[g] == 1 else dataclasses.replace(layer, name=f"{layer.name} (+{sites[g] - 1} more)")
                   for g, layer in merged.items())
    return Network(name=name, title=title, source=source, batch=batch, input=input, layers=layers)
