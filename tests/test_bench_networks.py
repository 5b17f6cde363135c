"""The networks suite on the CPU: layer lists against the architectures, the command line, JSON and page.

The layer lists (cuconv.bench.networks) are written by hand; here each is re-derived from its
architecture's configuration by a short builder of its own (torchvision's block settings, diffusers'
SD 1.5 configs, ultralytics' yaml with its width and depth scaling) and compared layer for layer,
and the MAC totals (and for EfficientNet-B0, ResNeXt-50 32x4d and ShuffleNetV2 the parameter counts)
are compared with the figures the sources publish. The GPU runner is exercised
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
    "convnext_tiny": (22, 32, (224, 224, 3)), "efficientnet_b0": (81, 32, (224, 224, 3)),
    "resnext50_32x4d": (53, 32, (224, 224, 3)), "shufflenet_v2": (56, 32, (224, 224, 3))}


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


# torchvision _efficientnet_conf("efficientnet_b0"): (expand ratio, kernel, stride, in, out, layers)
EFFICIENTNET_B0_STAGES = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
                          (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))


def efficientnet_b0_convs():
    out, hw = [_c(224, 3, 32, 3, 2)], 112
    for t, k, s, cin, cout, n in EFFICIENTNET_B0_STAGES:
        for i in range(n):
            c, st = (cin, s) if i == 0 else (cout, 1)
            e, squeeze = c * t, max(1, c // 4)
            out += [_c(hw, c, e, 1)] if e != c else []
            out.append(_c(hw, e, e, k, st, e))
            hw = (hw - 1) // st + 1  # padding k // 2
            out += [_c(1, e, squeeze, 1), _c(1, squeeze, e, 1), _c(hw, e, cout, 1)]  # SE fc1, fc2; project
    return out + [_c(hw, 320, 1280, 1)]


def resnext50_32x4d_convs():
    out, hw, c = [_c(224, 3, 64, 7, 2)], 56, 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        width = planes * 4 // 64 * 32  # torchvision: int(planes * (width_per_group / 64.0)) * groups
        for b in range(blocks):
            s = stride if b == 0 else 1
            out += [_c(hw, c, width, 1), _c(hw, width, width, 3, s, 32), _c(hw // s, width, 4 * planes, 1)]
            if b == 0:
                out.append(_c(hw, c, 4 * planes, 1, s))
            hw, c = hw // s, 4 * planes
    return out


def shufflenet_v2_convs():
    out, hw, c = [_c(224, 3, 24, 3, 2)], 56, 24  # conv1, then the max pool
    for repeats, oup in ((4, 116), (8, 232), (4, 464)):
        half = oup // 2
        for i in range(repeats):
            if i == 0:  # stride 2: branch1 (depthwise, 1x1) and branch2 (1x1, depthwise, 1x1) read all of x
                out += [_c(hw, c, c, 3, 2, c), _c(hw // 2, c, half, 1)]
                out += [_c(hw, c, half, 1), _c(hw, half, half, 3, 2, half), _c(hw // 2, half, half, 1)]
                hw //= 2
            else:  # stride 1: branch2 on half the channels
                out += [_c(hw, half, half, 1), _c(hw, half, half, 3, 1, half), _c(hw, half, half, 1)]
            c = oup
    return out + [_c(hw, c, 1024, 1)]  # conv5


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
            "sd_unet": sd_unet_convs, "yolov8s": yolov8s_convs, "convnext_tiny": convnext_tiny_convs,
            "efficientnet_b0": efficientnet_b0_convs, "resnext50_32x4d": resnext50_32x4d_convs,
            "shufflenet_v2": shufflenet_v2_convs}
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
    output, or one of those halved (a pool) or doubled (an upsampling), or 1x1 (EfficientNet's
    squeeze-excitation convs, on the globally pooled image); where the network only chains (no
    concatenation: the classifiers and the VAE) its channels are an earlier output's too."""
    net = NETWORKS[name]
    sizes, channels = {net.input[:2]}, {net.input[2]}
    for layer in net.layers:
        if layer.name != "model.22 Detect.dfl":  # the box distributions, reshaped to (16, 4, 8400)
            near = {(h * k, w * k) for h, w in sizes for k in (0.5, 1, 2)}
            pooled = name == "efficientnet_b0" and ".se.fc" in layer.name
            assert (layer.H, layer.W) == (1, 1) if pooled else (layer.H, layer.W) in near, layer
        if name in ("resnet50", "mobilenet_v2", "convnext_tiny", "sd_vae_decoder", "efficientnet_b0",
                    "resnext50_32x4d"):
            assert layer.C in channels, layer
        sizes.add((layer.P, layer.Q))
        channels.add(layer.K)
    assert (NETWORKS["sd_vae_decoder"].layers[-1].P, NETWORKS["sd_vae_decoder"].layers[-1].K) == (512, 3)


# Conv MACs of one image, counted from the builders' architectures (printed in the suite's summary).
CONV_MACS = {"resnet50": 4_087_136_256, "mobilenet_v2": 299_494_272, "sd_vae_decoder": 1_235_784_630_272,
             "sd_unet": 221_973_053_440, "yolov8s": 14_301_312_000, "convnext_tiny": 292_965_120,
             "efficientnet_b0": 384_534_752, "resnext50_32x4d": 4_228_431_872, "shufflenet_v2": 143_883_992}


@pytest.mark.parametrize("name", list(NETWORKS))
def test_conv_macs_per_image(name):
    net = NETWORKS[name]
    assert net.macs == CONV_MACS[name] * net.batch
    built = sum(_macs(*c, pad=0 if (name, c[4]) in NO_PAD else c[4] // 2) for c in BUILDERS[name]())
    assert built == CONV_MACS[name]


def test_conv_macs_agree_with_the_published_model_figures():
    """torchvision's model docs give GMACs per 224x224 image (ResNet-50 4.09, MobileNetV2 0.30,
    ConvNeXt-T 4.46, EfficientNet-B0 0.386, ResNeXt-50 32x4d 4.23, ShuffleNetV2 x1.0 0.14 to two places,
    each with its final linear layer);
    ultralytics 28.6 GFLOPs (2 per MAC) for YOLOv8s at 640, batch norms fused into the convs."""
    per_image = {n: net.macs / net.batch for n, net in NETWORKS.items()}
    assert per_image["resnet50"] + 2048 * 1000 == pytest.approx(4.09e9, rel=2e-3)
    assert per_image["mobilenet_v2"] + 1280 * 1000 == pytest.approx(0.30e9, rel=5e-3)
    assert per_image["efficientnet_b0"] + 1280 * 1000 == pytest.approx(0.386e9, rel=2e-3)
    assert per_image["resnext50_32x4d"] + 2048 * 1000 == pytest.approx(4.23e9, rel=2e-3)
    assert round((per_image["shufflenet_v2"] + 1024 * 1000) / 1e9, 2) == 0.14
    linear = sum(d * (56 // 2 ** i) ** 2 * 8 * dim * dim  # each CNBlock's dim -> 4 dim -> dim
                 for i, (d, dim) in enumerate(zip(CONVNEXT_DEPTHS, CONVNEXT_DIMS))) + 768 * 1000
    assert per_image["convnext_tiny"] == pytest.approx(0.293e9, rel=2e-3)
    assert per_image["convnext_tiny"] + linear == pytest.approx(4.46e9, rel=2e-3)
    assert 2 * per_image["yolov8s"] == pytest.approx(28.6e9, rel=2e-3)


@pytest.mark.parametrize("name, features, published", [("efficientnet_b0", 1280, 5_288_548),
                                                         ("resnext50_32x4d", 2048, 25_028_904),
                                                         ("shufflenet_v2", 1024, 2_278_604)])
def test_parameters_of_the_listed_convs_add_up_to_the_published_count(name, features, published):
    """torchvision's ``num_params``, rebuilt from the list: every conv's filter, a batch norm (weight and
    bias) after each conv but EfficientNet's squeeze-excitation convs (on 1x1 images), which have a
    bias instead, and the classifier ``nn.Linear`` (features -> 1000, with bias). It pins the channels
    and groups of every conv, which the MAC total alone would not."""
    net = NETWORKS[name]
    per_conv = sum(layer.count * (layer.K * layer.R * layer.S * layer.C // layer.groups
                                  + (layer.K if (layer.H, layer.W) == (1, 1) else 2 * layer.K))
                   for layer in net.layers)
    assert per_conv + features * 1000 + 1000 == published


def test_network_merges_repeats_into_the_first_place():
    net = network("toy", "Toy", "here", 4, (8, 8, 3), [conv("a", 8, 3, 8, 3), conv("b", 8, 8, 8, 3, count=2),
                                                       conv("c", 8, 8, 8, 1), conv("d", 8, 8, 8, 3)])
    assert [(layer.name, layer.count) for layer in net.layers] == [("a", 1), ("b (+1 more)", 3), ("c", 1)]
    assert net.conv_layers == 5 and net.macs == 4 * 64 * 8 * (27 + 3 * 72 + 8)
    assert Layer("x", 1, 7, 7, 4, 4, 3, 3, stride=2, pad=1, groups=4).describe() == "C4 7x7 -> K4 3x3 s2 p1 g4"


# ------------------------------------------------------------------------------------------- check
def test_check_layer_crops_rows_for_strided_dilated_grouped_layers(monkeypatch):
    """The check of :func:`runner.check_layer` on cuconv's CPU result: whole first image, then only
    its first output rows (a tiny budget), where a wrong row inside the crop fails and one outside
    it is not looked at."""
    import cuconv
    layer = Layer("g", 1, 13, 9, 4, 6, 3, 3, stride=2, pad=1, dilation=2, groups=2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 13, 9, 4)).astype(np.float32)
    w = rng.standard_normal((6, 3, 3, 2)).astype(np.float32)
    y = cuconv.conv2d(x, w, stride=2, padding=1, dilation=2, groups=2)
    assert y.shape == (1, layer.P, layer.Q, 6) == (1, 6, 4, 6)
    err, scope = runner.check_layer(layer, x, w, y)
    assert err < 1e-6 and scope == "first image"
    monkeypatch.setattr(runner, "CHECK_BUDGET", 2 * layer.Q * 6 * 9 * 2)  # two output rows
    err, scope = runner.check_layer(layer, x, w, y)
    assert err < 1e-6 and scope == "first image, output rows 0..1 of 6"
    bad = y.copy()
    bad[0, 5] += 1.0
    assert runner.check_layer(layer, x, w, bad)[0] < 1e-6
    bad[0, 1] += 1.0
    assert runner.check_layer(layer, x, w, bad)[0] > 0.1
    bad[0, 0, 0, 0] = np.nan
    assert runner.check_layer(layer, x, w, bad)[0] == float("inf")


# ------------------------------------------------------------------------------------------- runner
TOY = network("toy", "Toy", "tests", 2, (8, 8, 3), [conv("stem", 8, 3, 8, 3, stride=2), conv("body", 4, 8, 8, 3),
                                                    conv("dw", 4, 8, 8, 3, groups=8), conv("body", 4, 8, 8, 3)])


class _FakeGpu:
    """prepare_layer and time_pass without a GPU: each library's call of a layer appends
    (library, layer name) to ``trace`` and 'takes' ``cost[library] * (index + 1)`` ms (placeholders)."""

    def __init__(self, fail_check=(), no_cuconv=(), cost=None):
        self.trace, self.fail_check, self.no_cuconv = [], set(fail_check), set(no_cuconv)
        self.cost = cost or {"cuconv": 1.0, "cudnn": 2.0}
        self.passes = []

    def prepare_layer(self, layer, dtype, torch=None, layout="NHWC", precision=None):
        rec = runner.layer_record(layer, dtype)
        self.precisions = getattr(self, "precisions", []) + [precision]
        index = [lay.name for lay in TOY.layers].index(layer.name) if layer in TOY.layers else 0
        rec.update(kernel="sm90_tma", rel_error=1.0 if layer.name in self.fail_check else 1e-3,
                   check_scope="first image", check_ok=not {layer.name} & (self.fail_check | self.no_cuconv))

        def call(lib):
            f = (lambda: self.trace.append((lib, layer.name)))
            f.ms = self.cost[lib] * (index + 1)
            return f
        cuconv_call = None if layer.name in self.no_cuconv else call("cuconv")
        return runner.Prepared(layer, rec, cuconv_call, call("cudnn") if torch is not None else None)

    def time_pass(self, calls, passes, sync_each, torch_events):
        self.passes.append((len(calls), passes, sync_each, torch_events))
        for _ in range(passes):
            for f in calls:
                f()
        return sum(f.ms for f in calls) + (0.5 * len(calls) if sync_each else 0.0)


def test_bench_network_times_layers_then_the_pass_in_network_order(monkeypatch):
    gpu = _FakeGpu()
    monkeypatch.setattr(runner, "prepare_layer", gpu.prepare_layer)
    monkeypatch.setattr(runner, "time_pass", gpu.time_pass)
    lines = []
    rec = runner.bench_network(TOY, "bfloat16", torch=object(), log=lines.append)
    assert [layer["name"] for layer in rec["layers"]] == ["stem", "body (+1 more)", "dw"]
    assert [layer["count"] for layer in rec["layers"]] == [1, 2, 1]
    assert rec["layers"][1]["ms"] == {"cuconv": 2.0, "cudnn": 4.0, "cuconv_one_at_a_time": 2.5,
                                      "cudnn_one_at_a_time": 4.5}
    assert rec["ms"]["cuconv"] == 1.0 + 2 * 2.0 + 3.0 and rec["ms"]["cudnn"] == 2 * rec["ms"]["cuconv"]
    assert rec["ms"]["cuconv_one_at_a_time"] == rec["ms"]["cuconv"] + 0.5 * 4
    assert rec["ms"]["cuconv_sum_of_layers"] == rec["ms"]["cuconv"]
    assert rec["check_ok"] and rec["conv_layers"] == 4 and rec["macs"] == TOY.macs
    # the network pass: each layer `count` times in network order, PASSES times, each library alternating
    network_pass = [("cuconv", "stem"), ("cuconv", "body (+1 more)"), ("cuconv", "body (+1 more)"), ("cuconv", "dw")]
    n = len(network_pass)
    timed = gpu.trace[-2 * runner.REPEATS * runner.PASSES * n:]
    assert timed[:runner.PASSES * n] == network_pass * runner.PASSES
    assert timed[runner.PASSES * n:][:n] == [("cudnn", name) for _, name in network_pass]
    assert gpu.passes[-1] == (n, runner.PASSES, True, True)  # cuDNN, one at a time, torch's events
    assert (1, 1, False, False) in gpu.passes  # each layer's warm-up pass
    assert len(lines) == 3 and "sm90_tma" in lines[0] and "2.00x" in lines[0] and "1.67x" in lines[0]
    # the depthwise layer "dw" (N2 C8 4x4, 3x3, bf16): 2 bytes x (256 in + 72 filter + 256 out) = 1168
    # bytes per call, over 3 ms (cuconv) and 6 ms (cuDNN) per call
    dw = rec["layers"][2]
    assert dw["kind"] == "depthwise" and dw["bytes"] == 1168
    assert dw["tbps"] == pytest.approx(1168 / 3e-3 / 1e12) and dw["tbps_cudnn"] == pytest.approx(dw["tbps"] / 2)
    assert "tbps" not in rec["layers"][0] and "TB/s" in lines[2] and "TB/s" not in lines[0]
    assert rec["depthwise"] == dict(convs=1, layers=1, ms={"cuconv": 3.0, "cudnn": 6.0}, tbps=dw["tbps"],
                                    tbps_cudnn=dw["tbps_cudnn"])
    assert "depthwise: 1 of 4 convs, count x ms per call: cuDNN 6.000 cuconv 3.000 (2.00x, 38% of cuconv's " \
           "layer sum); TB/s cuDNN 0.00 cuconv 0.00" in "\n".join(output.summary_lines([rec]))


def test_float32_networks_time_cudnn_with_tf32_on_and_off(monkeypatch):
    gpu = _FakeGpu()
    monkeypatch.setattr(runner, "prepare_layer", gpu.prepare_layer)
    monkeypatch.setattr(runner, "time_pass", gpu.time_pass)
    cudnn = types.SimpleNamespace(allow_tf32=True)
    torch = types.SimpleNamespace(backends=types.SimpleNamespace(cudnn=cudnn))
    lines = []
    rec = runner.bench_network(TOY, "float32", torch=torch, log=lines.append, precision="tf32")
    assert rec["precision"] == "tf32" and gpu.precisions == ["tf32"] * len(TOY.layers)
    assert cudnn.allow_tf32 is True  # put back
    assert rec["ms"]["cudnn_fp32"] == rec["ms"]["cudnn"] and "cudnn_fp32_one_at_a_time" in rec["ms"]
    assert all("cudnn_fp32" in layer["ms"] for layer in rec["layers"])
    assert "cuDNN TF32 off" in lines[0]
    text = "\n".join(output.summary_lines([rec]))
    assert "precision tf32; cuDNN with TF32 off:" in text and "speed 2.00x" in text
    bf16 = runner.bench_network(TOY, "bfloat16", torch=torch, log=lambda *a: None)
    assert "precision" not in bf16 and "cudnn_fp32" not in bf16["ms"]


def test_bench_network_reports_failed_checks_and_layers_cuconv_cannot_run(monkeypatch):
    gpu = _FakeGpu(fail_check={"dw"}, no_cuconv={"stem"})
    monkeypatch.setattr(runner, "prepare_layer", gpu.prepare_layer)
    monkeypatch.setattr(runner, "time_pass", gpu.time_pass)
    rec = runner.bench_network(TOY, "float16", torch=None, log=lambda *a: None)
    assert not rec["check_ok"] and "check failed: stem, dw" in rec["notes"]
    assert "cuconv not timed: stem did not run" in rec["notes"] and rec["ms"] == {}
    assert all("cudnn" not in layer["ms"] for layer in rec["layers"])
    assert rec["layers"][2]["ms"]["cuconv"] == 3.0  # a failed check is still timed, and marked
    text = "\n".join(output.summary_lines([rec]))
    assert "FAILED" in text and "note: check failed: stem, dw" in text


def test_run_goes_over_networks_and_dtypes(monkeypatch):
    gpu = _FakeGpu()
    monkeypatch.setattr(runner, "prepare_layer", gpu.prepare_layer)
    monkeypatch.setattr(runner, "time_pass", gpu.time_pass)
    pool = types.SimpleNamespace(free_all_blocks=lambda: None)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(get_default_memory_pool=lambda: pool))
    monkeypatch.setitem(runner.NETWORKS, "toy", TOY)
    emptied = []
    torch = types.SimpleNamespace(backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(benchmark=False)),
                                  cuda=types.SimpleNamespace(empty_cache=lambda: emptied.append(1)))
    recs = runner.run(["toy", "convnext_tiny"], ["bfloat16", "float16"], torch=torch, log=lambda *a: None)
    assert [(r["network"], r["dtype"]) for r in recs] == [("toy", "bfloat16"), ("toy", "float16"),
                                                         ("convnext_tiny", "bfloat16"), ("convnext_tiny", "float16")]
    assert torch.backends.cudnn.benchmark is True and len(emptied) == 4
    assert len(recs[2]["layers"]) == len(NETWORKS["convnext_tiny"].layers) and recs[2]["conv_layers"] == 22


def test_depthwise_bandwidth_of_a_synthetic_record():
    """TB/s = (input + filter + output bytes) / back-to-back ms per call, counted here by hand for a
    depthwise layer with channel multiplier 2 (placeholder times, not measurements): fp16, input
    32 x 112 x 112 x 96, filter 192 x 3 x 3 x 1, output 32 x 56 x 56 x 192."""
    layer = Layer("dw", N=32, H=112, W=112, C=96, K=192, R=3, S=3, stride=2, pad=1, groups=96, count=3)
    rec = dict(runner.layer_record(layer, "float16"), check_ok=True, rel_error=1e-3, kernel="depthwise",
               ms={"cuconv": 0.04, "cudnn": 0.03, "cuconv_one_at_a_time": 0.05})
    nbytes = 2 * (38_535_168 + 1_728 + 19_267_584)
    assert layer.kind == "depthwise" and (layer.P, layer.Q) == (56, 56) and rec["bytes"] == nbytes == 115_608_960
    assert runner.bandwidth(rec) == {"tbps": pytest.approx(nbytes / 0.04e-3 / 1e12),
                                     "tbps_cudnn": pytest.approx(nbytes / 0.03e-3 / 1e12)}
    rec.update(runner.bandwidth(rec))
    assert rec["tbps"] == pytest.approx(2.890224) and "TB/s cuDNN  3.85 cuconv  2.89" in output.layer_line(rec)
    # cuconv alone: no cuDNN figure; a grouped or dense layer: none at all
    assert runner.bandwidth(dict(rec, ms={"cuconv": 0.04})) == {"tbps": pytest.approx(2.890224)}
    grouped = runner.layer_record(Layer("g", 32, 56, 56, 128, 128, 3, 3, pad=1, groups=32), "float16")
    assert grouped["kind"] == "grouped" and runner.bandwidth(dict(grouped, ms={"cuconv": 1.0})) == {}
    dense = dict(runner.layer_record(Layer("d", 32, 56, 56, 192, 32, 1, 1), "float16"), ms={"cuconv": 1.0})
    assert runner.bandwidth(dense) == {} and "TB/s" not in output.layer_line(dense)
    # the network's depthwise layers together: count x ms per call, their bytes over that time
    summary = runner.depthwise_summary([dense, rec])
    assert summary == dict(convs=3, layers=1, ms={"cuconv": pytest.approx(0.12), "cudnn": pytest.approx(0.09)},
                           tbps=pytest.approx(2.890224), tbps_cudnn=pytest.approx(3.853632))
    assert runner.depthwise_summary([dense]) is None
    assert runner.depthwise_summary([dict(rec, ms={"cuconv": 0.04})])["ms"] == {"cuconv": pytest.approx(0.12)}


# ------------------------------------------------------------------------------------------- command line
def test_cli_parses_the_networks_options():
    args = cli.parser().parse_args(["--suite", "networks", "--network", "resnet50", "--network", "sd_unet",
                                    "--layers", "--dtype", "bfloat16"])
    assert args.suite == ["networks"] and args.network == ["resnet50", "sd_unet"] and args.layers
    assert "networks" not in cli.ALL_SUITES and "networks" in cli.OPT_IN_SUITES


@pytest.mark.parametrize("argv, words", [
    (["--suite", "networks", "--network", "resnet51"], ["--network", "invalid choice: 'resnet51'", "yolov8s"]),
    (["--suite", "conv3d", "--network", "resnet50"], ["--network", "add --suite networks"])])
def test_cli_refuses_a_bad_network_naming_the_option(argv, words, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


@pytest.mark.parametrize("argv", [["--suite", "networks"], ["--network", "yolov8s", "--json", "n.json"]])
def test_networks_exit_2_without_cupy(argv, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert cli.main(argv) == environment.EXIT_UNAVAILABLE
    assert "CuPy is not installed" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def _fake_record(name="resnet50", dtype="bfloat16", cuconv=1.0, cudnn=1.5, ok=True):
    """A network record in the suite's format with placeholder timings, not measurements."""
    net = NETWORKS[name]
    layers = []
    for layer in net.layers[:2]:
        rec = runner.layer_record(layer, dtype)
        rec.update(kernel="sm90_tma", rel_error=2e-3, check_scope="first image", check_ok=ok,
                   ms={"cuconv": 0.1, "cudnn": 0.2, "cuconv_one_at_a_time": 0.3, "cudnn_one_at_a_time": 0.3})
        layers.append(rec)
    return dict(network=name, title=net.title, source=net.source, batch=net.batch, input=list(net.input),
                dtype=dtype, conv_layers=net.conv_layers, unique_layers=len(net.layers), macs=net.macs,
                ms={"cuconv": cuconv, "cudnn": cudnn, "cuconv_one_at_a_time": 2.0, "cudnn_one_at_a_time": 2.5},
                notes=[], layers=layers, check_ok=ok)


def test_json_and_report_round_trip(tmp_path):
    common = {"date": "2030-01-02T03:04:05+00:00", "device": "GPU X (sm_90a, 132 SMs)",
              "command": "python -m cuconv.bench --suite networks --json run.json", "ceilings": {}}
    recs = [_fake_record(), _fake_record("sd_unet", cuconv=3.0, cudnn=2.4)]
    cli.write_json(str(tmp_path / "run.json"), [], {"networks": recs}, common, {"cuconv": 20.0})
    assert [p.name for p in tmp_path.iterdir()] == ["run_networks.json"]
    doc = report.load_result(str(tmp_path / "run_networks.json"))
    assert doc["suite"] == "networks" and report.suite_of(doc) == "networks"
    assert report.suite_of({"records": recs}) == "networks"
    assert report.speeds(doc) == pytest.approx([1.5, 0.8])
    page = report.render(str(tmp_path))
    assert "## run_networks.json: networks" in page and "- device: GPU X (sm_90a, 132 SMs)" in page
    assert "| ResNet-50, N=32 | bfloat16 | 53 | 130.8 | 1.500 | 1.000 | 1.50x | 2.500 | 2.000 | 1.25x | ok |" in page
    assert "| SD UNet, N=2 | bfloat16 | 98 | 443.9 | 2.400 | 3.000 | 0.80x |" in page
    assert "<summary>ResNet-50, N=32, bfloat16: layers (torchvision.models.resnet50" in page
    assert "| conv1 | C3 224x224 -> K64 7x7 s2 p3 | 1 | sm90_tma | 0.200 | 0.100 | 2.00x | 0.300 | 0.300 | 1.00x " \
           "| ok (2.0e-03) |" in page
    assert "geomean speed vs cuDNN: 1.095x over 2 rows (min 0.80x)" in page
    text = "\n".join(output.summary_lines(recs) + output.layer_lines(recs[0]))
    assert "1.50x" in text and "0.80x" in text and "sm90_tma" in text and "C64 56x56 -> K64 1x1 s1 p0" in text


def test_plot_networks_from_json_needs_no_cupy(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install '.[bench]')")
    import matplotlib
    matplotlib.use("Agg")
    monkeypatch.setitem(sys.modules, "cupy", None)
    path = tmp_path / "n.json"
    path.write_text(json.dumps({"suite": "networks", "device": "GPU X", "records": [
        _fake_record(), _fake_record("mobilenet_v2", cuconv=4.5, cudnn=1.3)]}))
    png = tmp_path / "n.png"
    assert cli.main(["--plot", str(png), "--plot-from", str(path)]) == 0
    assert png.stat().st_size > 10_000
    fig = output.plot_networks({"records": [_fake_record(cudnn=None)]})
    assert "nothing to draw" in fig.axes[0].get_title()


def test_a_networks_run_with_the_gpu_work_replaced(monkeypatch, tmp_path, capsys):
    """``--suite networks`` end to end on the CPU: the named networks run (GPU work replaced by
    placeholders), the summary and layer tables print, the JSON carries date, device and command."""
    from cuconv.bench import Ceilings
    gpu = _FakeGpu()
    monkeypatch.setattr(runner, "prepare_layer", gpu.prepare_layer)
    monkeypatch.setattr(runner, "time_pass", gpu.time_pass)
    pool = types.SimpleNamespace(free_all_blocks=lambda: None)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(get_default_memory_pool=lambda: pool))
    dev = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", describe=lambda: "NVIDIA H100 80GB HBM3 (sm_90a)")
    monkeypatch.setattr(cli, "require_gpu", lambda: dev)
    monkeypatch.setattr(cli, "torch_for_cudnn", lambda disabled=False: (None, "torch is not installed: ..."))
    monkeypatch.setattr(cli, "spin_up", lambda: None)
    monkeypatch.setattr(cli, "measure", lambda name, log: Ceilings.for_device(name, measured_copy_tbps=3.0))
    monkeypatch.setattr(conv2d, "host_overhead_us", lambda with_torch: {"cuconv": 20.0})
    monkeypatch.setattr(conv2d, "bench_shape", lambda *a, **k: pytest.fail("a conv2d suite ran"))
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install '.[bench]')")
    import matplotlib
    matplotlib.use("Agg")
    argv = ["--network", "convnext_tiny", "--network", "mobilenet_v2", "--dtype", "bfloat16", "--layers",
            "--json", str(tmp_path / "h100.json"), "--plot", str(tmp_path / "h100.png")]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "== network ConvNeXt-T (convnext_tiny), N=32, bfloat16, NHWC: 22 convs" in printed
    assert "features.5.dwconv" in printed and "ConvNeXt-T (convnext_tiny), N=32, bfloat16: ms per call" in printed
    assert "depthwise: 18 of 22 convs" in printed and "depthwise: 17 of 52 convs" in printed
    doc = json.loads((tmp_path / "h100_networks.json").read_text())
    assert [r["network"] for r in doc["records"]] == ["convnext_tiny", "mobilenet_v2"]
    assert doc["device"] == "NVIDIA H100 80GB HBM3 (sm_90a)" and doc["date"]
    assert doc["command"].endswith("python -m cuconv.bench " + " ".join(argv))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h100.png", "h100_networks.json"]
    assert (tmp_path / "h100.png").stat().st_size > 10_000
    gpu.fail_check = {"features.18"}
    assert cli.main(["--network", "mobilenet_v2", "--dtype", "float16"]) == 1


def test_report_shows_depthwise_bandwidth():
    from cuconv.bench import report
    rec = dict(network="m", title="M", batch=2, dtype="bfloat16", layers=[
        dict(name="dw", describe="C8 4x4 -> K8 3x3 g8", count=1, kernel="depthwise_direct", kind="depthwise",
             ms=dict(cuconv=0.5, cudnn=1.0), check_ok=True, tbps=2.5, tbps_cudnn=1.25),
        dict(name="pw", describe="C8 4x4 -> K8 1x1", count=1, kernel="sm90_tma", kind="conv",
             ms=dict(cuconv=0.5, cudnn=0.5), check_ok=True)],
        depthwise=dict(convs=1, layers=1, ms=dict(cuconv=0.5, cudnn=1.0), tbps=2.5, tbps_cudnn=1.25))
    head, rows = report._network_layer_rows(rec)
    col = head.index("depthwise TB/s cuDNN / cuconv")
    assert [r[col] for r in rows] == ["1.25 / 2.50", "-"]
    text = "\n".join(report._network_sections(dict(suite="networks", records=[rec])))
    assert "Depthwise layers: 1 of the pass's convs" in text and "1.25 / 2.50 TB/s" in text


def test_the_check_bound_follows_the_precision():
    """float32 layers at precision "tf32" are checked against TF32's bound, every other one against its
    dtype's."""
    from cuconv.bench.conv2d import TF32_TOLERANCE, TOLERANCE, check_bound
    assert check_bound("float32") == check_bound("float32", "float32") == TOLERANCE["float32"]
    assert check_bound("float32", "tf32") == TF32_TOLERANCE > TOLERANCE["float32"]
    assert check_bound("bfloat16") == TOLERANCE["bfloat16"]
