"""cuconv.autotune on the GPU (gpu-marked): layers of the networks suite measured on the device, the
result of the decision against the float64 reference, the decision kept (a second call measures
nothing), a decision file read back, and every timed candidate within the agreement bound of the
automatic choice (a candidate that is not is named as failed in the record)."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

import cuconv

from conftest import assert_close, random_array

pytestmark = pytest.mark.gpu
tuner = importlib.import_module("cuconv.autotune")

#: (N, H, W, C, K, R, stride, groups, layout, dtype): a YOLOv8s 3x3, ResNet-50's layer4 downsample, a
#: MobileNetV2 depthwise layer, an SD VAE-style 3x3 on NCHW arrays, a few-channel stem.
LAYERS = {
    "yolo-3x3": (4, 80, 80, 64, 64, 3, 1, 1, "NHWC", "float16"),
    "resnet-1x1-s2": (8, 14, 14, 1024, 2048, 1, 2, 1, "NHWC", "bfloat16"),
    "depthwise": (8, 56, 56, 144, 144, 3, 1, 144, "NHWC", "float16"),
    "nchw-3x3": (1, 64, 64, 256, 256, 3, 1, 1, "NCHW", "bfloat16"),
    "stem": (4, 224, 224, 3, 32, 3, 2, 1, "NHWC", "float16"),
}


def _arrays(cp, name, seed=0):
    N, H, W, C, K, R, stride, groups, layout, dtype = LAYERS[name]
    rng = np.random.default_rng(seed)
    x = random_array(rng, (N, H, W, C), dtype)
    w = random_array(rng, (K, R, R, C // groups), dtype, 1 / np.sqrt(R * R * C // groups))
    b = random_array(rng, (K,), dtype)
    if layout == "NCHW":
        x, w = np.ascontiguousarray(x.transpose(0, 3, 1, 2)), np.ascontiguousarray(w.transpose(0, 3, 1, 2))
    args = dict(stride=stride, padding=R // 2, groups=groups, layout=layout, activation="relu")
    return x, w, b, args, dtype


@pytest.fixture(autouse=True)
def _fresh():
    tuner.forget()
    yield
    tuner.forget()


@pytest.mark.parametrize("name", list(LAYERS))
def test_autotuned_layer(cp, name):
    x, w, b, args, dtype = _arrays(cp, name)
    want = cuconv.reference.conv2d(x, w, b, **args)
    xd, wd, bd = cp.asarray(x), cp.asarray(w), cp.asarray(b)
    with cuconv.autotune():
        first = cuconv.conv2d(xd, wd, bd, **args)
        e = cuconv.explain(xd, wd, bd, **args)
        again = cuconv.conv2d(xd, wd, bd, **args)
    assert_close(first, want, dtype, str(e))
    assert cp.array_equal(first, again), "the decision holds: the same plan, the same bits"
    t = e.tuning
    assert t is not None and t.source == "measured" and t.chosen.us is not None
    assert t.chosen.us <= t.automatic.us
    assert len(t.candidates) >= 2, str(e)
    bad = [m for m in t.candidates if m.error is not None and "differs" in m.error]
    assert not bad, "\n".join(m.describe() for m in bad)
    assert e.tuning is cuconv.explain(xd, wd, bd, **args).tuning, "measured once"


def test_decision_file_on_the_gpu(cp, tmp_path):
    path = tmp_path / "tuned.json"
    x, w, b, args, dtype = _arrays(cp, "yolo-3x3")
    xd, wd, bd = cp.asarray(x), cp.asarray(w), cp.asarray(b)
    with cuconv.autotune(path=path):
        chosen = cuconv.explain(xd, wd, bd, **args).tuning.chosen
    entry = next(iter(json.loads(path.read_text())["entries"].values()))
    assert entry["kernel"] == chosen.kernel
    tuner.forget()
    with cuconv.autotune(path=path):
        y = cuconv.conv2d(xd, wd, bd, **args)
        e = cuconv.explain(xd, wd, bd, **args)
    assert e.tuning.source == str(path) and e.tuning.chosen.overrides == chosen.overrides
    assert_close(y, cuconv.reference.conv2d(x, w, b, **args), dtype)
