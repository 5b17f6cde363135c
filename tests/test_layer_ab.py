"""``python -m cuconv.bench.layer_ab``: which layers it times, its arguments and its report (CPU)."""

from __future__ import annotations

import pytest

from cuconv.bench import layer_ab


def test_split_mode_takes_the_layers_with_few_tiles():
    chosen = layer_ab.layers(["sd_unet"], None, "bfloat16", 132, layer_ab.few_tiles)
    assert chosen, "the SD UNet's 8x8 and 16x16 layers have few tiles at batch 2"
    for name, layer, why in chosen:
        assert name == "sd_unet" and layer.groups == 1 and "reduction steps" in why
        tiles = int(why.split(" tiles")[0])
        assert 2 * tiles <= 132
    assert len({layer.geometry for _, layer, _ in chosen}) == len(chosen)
    # batch 1 makes ResNet-50's late layers small problems; at its suite batch (32) none is
    assert layer_ab.layers(["resnet50"], 1, "bfloat16", 132, layer_ab.few_tiles)
    assert not layer_ab.layers(["resnet50"], None, "bfloat16", 132, layer_ab.few_tiles)


def test_kernel_mode_takes_the_layers_the_kernel_accepts():
    chosen = layer_ab.layers(["resnet50", "sd_vae_decoder", "convnext_tiny"], None, "bfloat16", 132,
                             layer_ab.accepted_by("sm90_fold"))
    described = {layer.describe() for _, layer, _ in chosen}
    assert "C3 224x224 -> K64 7x7 s2 p3" in described and "C4 64x64 -> K512 3x3 s1 p1" in described
    assert all(layer.C < 32 for _, layer, _ in chosen)
    assert all(why.startswith("fold_width:") for _, _, why in chosen)


def test_configurations_and_argument_errors(capsys):
    args = layer_ab.parser().parse_args(["--split-ways", "2", "8"])
    assert layer_ab.configurations(args) == [("2 parts", dict(split_ways=2, halo=False), None),
                                             ("8 parts", dict(split_ways=8, halo=False), None)]
    args = layer_ab.parser().parse_args(["--kernel", "sm90_fold"])
    assert layer_ab.configurations(args) == [("sm90_fold", {}, "sm90_fold")]
    assert layer_ab.main(["--list", "--split-ways", "4", "--network", "sd_unet", "--sm-count", "132"]) == 0
    out = capsys.readouterr().out
    assert "C1280 8x8 -> K1280 3x3 s1 p1" in out and "reduction steps" in out
    for argv in (["--split-ways", "1"], ["--split-ways", "17"], ["--kernel", "nope"], ["--split-ways", "2", "--batch", "0"],
                 ["--kernel", "sm90_fold", "--runs", "0"], []):
        with pytest.raises(SystemExit):
            layer_ab.main(argv + ["--list"])


def test_report_line_and_checks():
    rec = dict(layer="up.0.conv", auto_ms=0.040, ms={"2 parts": 0.030, "8 parts": 0.012, "16 parts": 0.015},
               detail={"2 parts": "all 14 tiles split in two along the reduction",
                       "8 parts": "all 14 tiles split 8 ways along the reduction",
                       "16 parts": "all 14 tiles split 9 ways along the reduction"},
               cudnn_ms=0.020, same_bits={"2 parts": True, "8 parts": True, "16 parts": True},
               rel_diff={"2 parts": 1e-3, "8 parts": 1e-3, "16 parts": 1e-3})
    text = layer_ab.line(rec)
    assert "best: 8 parts, 3.33x the automatic" in text and "16 parts(9) 15.0" in text and "cuDNN 20.0" in text
    assert layer_ab.checks_pass(rec)
    rec["same_bits"]["8 parts"] = False
    assert not layer_ab.checks_pass(rec)
    assert layer_ab.parts("grid 14 CTAs, one tile per CTA") == 1


def test_wider_split_mode_takes_the_layers_of_one_wave():
    chosen = layer_ab.layers(["resnet50", "yolov8s"], None, "bfloat16", 132, layer_ab.partial_wave)
    names = {layer.name for _, layer, _ in chosen}
    assert "model.22 Detect.cv3.2.0" in names and "layer4.0.conv2" in names
    for _, layer, why in chosen:
        tiles = int(why.split(" tiles")[0])
        assert tiles <= 132 and int(why.split(", ")[1].split()[0]) >= 24
    args = layer_ab.parser().parse_args(["--wider-split", "128", "160"])
    labels = [label for label, _, _ in layer_ab.configurations(args)]
    assert labels == ["unsplit", "128 in 2", "160 in 2"]
    args = layer_ab.parser().parse_args(["--wider-split", "128", "--parts", "2", "3"])
    assert [label for label, _, _ in layer_ab.configurations(args)] == ["unsplit", "128 in 2", "128 in 3"]
    with pytest.raises(SystemExit, match="parts"):
        layer_ab.check_args(layer_ab.parser().parse_args(["--wider-split", "128", "--parts", "1"]))
    with pytest.raises(SystemExit, match="wider-split"):
        layer_ab.check_args(layer_ab.parser().parse_args(["--wider-split", "100"]))
