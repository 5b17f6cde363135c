"""The networks suite on the CPU: layer lists against the architectures, the command line, JSON and page.

The layer lists (cuconv.bench.networks) are written by hand; here each is re-derived from its
architecture's configuration by a short builder of its own (torchvision's block settings, diffusers'
SD 1.5 configs, ultralytics' yaml with its width and depth scaling) and compared layer for layer,
and the MAC totals are compared with the figures the sources publish. The GPU runner is exercised
with its GPU work replaced by stand-ins (placeholder timings, not measurements).
"""

import json
import sys
import types
from collections import Counter

import numpy as np
import pytest

from cuconv.bench import cli, conv2d, environment, report
from cuconv.bench.networks import NETWORKS, Layer, conv, network, output, runner

EXPECTED = {  # name: (convs per forward pass, batch, input (H, W, C))
    "resnet50": (53, 32, (224, 224, 3)), "mobilenet_v2": (52, 32, (224, 224, 3)),
    "sd_vae_decoder": (36, 1, (64, 64, 4)), "sd_unet": (98, 2, (64, 64, 4)), "yolov8s": (64, 16, (640, 640, 3)),
    "convnext_tiny": (22, 32, (224, 224, 3))}


# ------------------------------------------------------------------------------------------- builders
# Each returns the convs of one image's forward pass as (H, W, C, K, filter, stride, groups), padding
# filter // 2 except where the architecture has none (the stems and downsamplers of ConvNeXt).

def _c(hw, C, K, f, s=1, g=1):
    H, W = (hw, hw) if isinstance(hw, int) else hw
    return (H, W, C, K, f, s, g)


def resnet50_convs():
    out, hw, c = [_c(224, 3, 64, 7, 2)], 56, 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            s = stride if b == 0 else 1
            out += [_c(hw, c, width, 1), _c(hw, width, width, 3, s), _c(hw // s, width, 4 * width, 1)]
            if b == 0:
                out.append(_c(hw, c, 4 * width, 1, s))
            hw, c = hw // s, 4 * width
    return out


def mobilenet_v2_convs():
    out, hw, c = [_c(224, 3, 32, 3, 2)], 112, 32
    for t, ch, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                        (6, 320, 1, 1)):
        for i in range(n):
            st, hidden = (s if i == 0 else 1), c * t
            out += [_c(hw, c, hidden, 1)] if t != 1 else []
            out.append(_c(hw, hidden, hidden, 3, st, hidden))
            hw //= st
            out.append(_c(hw, hidden, ch, 1))
            c = ch
    return out + [_c(hw, c, 1280, 1)]


CONVNEXT_DIMS, CONVNEXT_DEPTHS = (96, 192, 384, 768), (3, 3, 9, 3)


def convnext_tiny_convs():
    out, hw = [_c(224, 3, 96, 4, 4)], 56
    for i, (depth, dim) in enumerate(zip(CONVNEXT_DEPTHS, CONVNEXT_DIMS)):
        if i:
            out.append(_c(hw, CONVNEXT_DIMS[i - 1], dim, 2, 2))
            hw //= 2
        out += [_c(hw, dim, dim, 7, 1, dim)] * depth
    return out


def _resnet_block(hw, cin, cout):  # diffusers ResnetBlock2D: conv1, conv2, 1x1 conv_shortcut if widths differ
    return [_c(hw, cin, cout, 3), _c(hw, cout, cout, 3)] + ([_c(hw, cin, cout, 1)] if cin != cout else [])


def sd_vae_decoder_convs():
    out = [_c(64, 4, 4, 1), _c(64, 4, 512, 3)] + _resnet_block(64, 512, 512) * 2
    hw, c = 64, 512
    for i, ch in enumerate(reversed((128, 256, 512, 512))):
        for _ in range(3):  # layers_per_block + 1
            out += _resnet_block(hw, c, ch)
            c = ch
        if i < 3:
            hw *= 2
            out.append(_c(hw, c, c, 3))
    return out + [_c(hw, c, 3, 3)]


def sd_unet_convs():
    widths, attention = (320, 640, 1280, 1280), (True, True, True, False)
    out, hw, c, skips = [_c(64, 4, 320, 3)], 64, 320, [320]
    for i, ch in enumerate(widths):
        for _ in range(2):
            out += _resnet_block(hw, c, ch)
            c = ch
            out += [_c(hw, c, c, 1)] * 2 if attention[i] else []  # proj_in, proj_out
            skips.append(c)
        if i < 3:
            out.append(_c(hw, c, c, 3, 2))
            hw //= 2
            skips.append(c)
    out += _resnet_block(hw, c, c) + [_c(hw, c, c, 1)] * 2 + _resnet_block(hw, c, c)
    for i, ch in enumerate(reversed(widths)):
        for _ in range(3):
            out += _resnet_block(hw, c + skips.pop(), ch)
            c = ch
            out += [_c(hw, c, c, 1)] * 2 if attention[::-1][i] else []
        if i < 3:
            hw *= 2
            out.append(_c(hw, c, c, 3))
    assert not skips
    return out + [_c(hw, c, 4, 3)]


def yolov8s_convs():
    def width(c):  # ultralytics: make_divisible(min(c, max_channels) * width, 8), scale s
        return int(min(c, 1024) * 0.50)

    def depth(n):
        return max(round(n * 0.33), 1)

    def c2f(hw, c1, c2, n):
        c = c2 // 2
        return [_c(hw, c1, 2 * c, 1)] + [_c(hw, c, c, 3)] * (2 * n) + [_c(hw, (2 + n) * c, c2, 1)]

    ch = {}
    out = [_c(640, 3, width(64), 3, 2), _c(320, width(64), width(128), 3, 2)]
    out += c2f(160, width(128), width(128), depth(3))
    out += [_c(160, width(128), width(256), 3, 2)] + c2f(80, width(256), width(256), depth(6))
    ch[4] = width(256)
    out += [_c(80, width(256), width(512), 3, 2)] + c2f(40, width(512), width(512), depth(6))
    ch[6] = width(512)
    out += [_c(40, width(512), width(1024), 3, 2)] + c2f(20, width(1024), width(1024), depth(3))
    out += [_c(20, width(1024), width(1024) // 2, 1), _c(20, 2 * width(1024), width(1024), 1)]  # SPPF
    ch[9] = width(1024)
    out += c2f(40, ch[9] + ch[6], width(512), depth(3))
    ch[12] = width(512)
    out += c2f(80, width(512) + ch[4], width(256), depth(3))
    p3 = width(256)
    out += [_c(80, p3, width(256), 3, 2)] + c2f(40, width(256) + ch[12], width(512), depth(3))
    p4 = width(512)
    out += [_c(40, p4, width(512), 3, 2)] + c2f(20, width(512) + ch[9], width(1024), depth(3))
    p5 = width(1024)
    c2, c3 = max(16, p3 // 4, 16 * 4), max(p3, min(80, 100))
    for hw, c in ((80, p3), (40, p4), (20, p5)):
        out += [_c(hw, c, c2, 3), _c(hw, c2, c2, 3), _c(hw, c2, 4 * 16, 1),
                _c(hw, c, c3, 3), _c(hw, c3, c3, 3), _c(hw, c3, 80, 1)]
    return out + [_c((4, 80 * 80 + 40 * 40 + 20 * 20), 16, 1, 1)]


BUILDERS = {"resnet50": resnet50_convs, "mobilenet_v2": mobilenet_v2_convs, "sd_vae_decoder": sd_vae_decoder_convs,
            "sd_unet": sd_unet_convs, "yolov8s": yolov8s_convs, "convnext_tiny": convnext_tiny_convs}
NO_PAD = {("convnext_tiny", 4), ("convnext_tiny", 2)}  # (network, filter) without padding


def _macs(H, W, C, K, f, s, g, pad):
    P, Q = (H + 2 * pad - f) // s + 1, (W + 2 * pad - f) // s + 1
    return P * Q * K * f * f * (C // g)


# ------------------------------------------------------------------------------------------- layer lists
def test_every_network_is_listed_with_its_batch_input_and_conv_count():
    assert list(NETWORKS) == list(EXPECTED)
    for name, (convs, batch, inp) in EXPECTED.items():
        net = NETWORKS[name]
        assert (net.conv_layers, net.batch, net.input) == (convs, batch, inp), name
        assert net.source and all(layer.N == batch for layer in net.layers)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_layer_list_matches_the_architecture_built_from_its_config(name):
    net = NETWORKS[name]
    listed = Counter()
    for layer in net.layers:
        assert layer.R == layer.S and layer.dilation == 1
        pad = 0 if (name, layer.R) in NO_PAD else layer.R // 2
        assert layer.pad == pad, layer
        listed[(layer.H, layer.W, layer.C, layer.K, layer.R, layer.stride, layer.groups)] += layer.count
    assert listed == Counter(BUILDERS[name]())


@pytest.mark.parametrize("name", list(NETWORKS))
def test_layers_are_valid_and_listed_once(name):
    layers = NETWORKS[name].layers
    assert len({layer.geometry for layer in layers}) == len(layers)
    for layer in layers:
        assert layer.count >= 1 and layer.C % layer.groups == 0 and layer.K % layer.groups == 0
        assert layer.P >= 1 and layer.Q >= 1


@pytest.mark.parametrize("name", list(NETWORKS))
def test_each_layer_reads_a_size_an_earlier_layer_made(name):
    """Spatial chaining in forward order: a layer's input is the network's input, an earlier layer's
    output, or one of those halved (a pool) or doubled (an upsampling); where the network only chains
    (no concatenation: the classifiers and the VAE) its channels are an earlier output's too."""
    net = NETWORKS[name]
    sizes, channels = {net.input[:2]}, {net.input[2]}
    for layer in net.layers:
        if layer.name != "model.22 Detect.dfl":  # the box distributions, reshaped to (16, 4, 8400)
            near = {(h * k, w * k) for h, w in sizes for k in (0.5, 1, 2)}
            assert (layer.H, layer.W) in near, layer
        if name in ("resnet50", "mobilenet_v2", "convnext_tiny", "sd_vae_decoder"):
            assert layer.C in channels, layer
        sizes.add((layer.P, layer.Q))
        channels.add(layer.K)
    assert (NETWORKS["sd_vae_decoder"].layers[-1].P, NETWORKS["sd_vae_decoder"].layers[-1].K) == (512, 3)


# Conv MACs of one image, counted from the builders' architectures (printed in the suite's summary).
CONV_MACS = {"resnet50": 4_087_136_256, "mobilenet_v2": 299_494_272, "sd_vae_decoder": 1_235_784_630_272,
             "sd_unet": 221_973_053_440, "yolov8s": 14_301_312_000, "convnext_tiny": 292_965_120}


@pytest.mark.parametrize("name", list(NETWORKS))
def test_conv_macs_per_image(name):
    net = NETWORKS[name]
    assert net.macs == CONV_MACS[name] * net.batch
    built = sum(_macs(*c, pad=0 if (name, c[4]) in NO_PAD else c[4] // 2) for c in BUILDERS[name]())
    assert built == CONV_MACS[name]


def test_conv_macs_agree_with_the_published_model_figures():
    """torchvision's model docs give GMACs per 224x224 image (ResNet-50 4.09, MobileNetV2 0.30,
    ConvNeXt-T 4.46, each with its linear layers); ultralytics 28.6 GFLOPs (2 per MAC) for YOLOv8s
    at 640, batch norms fused into the convs."""
    per_image = {n: net.macs / net.batch for n, net in NETWORKS.items()}
    assert per_image["resnet50"] + 2048 * 1000 == pytest.approx(4.09e9, rel=2e-3)
    assert per_image["mobilenet_v2"] + 1280 * 1000 == pytest.approx(0.30e9, rel=5e-3)
    linear = sum(d * (56 // 2 ** i) ** 2 * 8 * dim * dim  # each CNBlock's dim -> 4 dim -> dim
                 for i, (d, dim) in enumerate(zip(CONVNEXT_DEPTHS, CONVNEXT_DIMS))) + 768 * 1000
    assert per_image["convnext_tiny"] == pytest.approx(0.293e9, rel=2e-3)
    assert per_image["convnext_tiny"] + linear == pytest.approx(4.46e9, rel=2e-3)
    assert 2 * per_image["yolov8s"] == pytest.approx(28.6e9, rel=2e-3)


def test_network_merges_repeats_into_the_first_place():
    net = network("toy", "Toy", "here", 4, (8, 8, 3), [conv("a", 8, 3, 8, 3), conv("b", 8, 8, 8, 3, count=2),
                                                       conv("c", 8, 8, 8, 1), conv("d", 8, 8, 8, 3)])
    assert [(layer.name, layer.count) for layer in net.layers] == [("a", 1), ("b (+1 more)", 3), ("c", 1)]
    assert net.conv_layers == 5 and net.macs == 4 * 64 * 8 * (27 + 3 * 72 + 8)
    assert Layer("x", 1, 7, 7, 4, 4, 3, 3, stride=2, pad=1, groups=4).describe() == "C4 7x7 -> K4 3x3 s2 p1 g4"
