"""``python -m cuconv.bench.split_sweep``: which layers it sweeps, its arguments and its report (CPU)."""

from __future__ import annotations

import pytest

from cuconv.bench import split_sweep


def test_candidates_are_the_layers_with_few_tiles():
    layers = split_sweep.candidates(["sd_unet"], None, "bfloat16", 132)
    assert layers, "the SD UNet's 8x8 and 16x16 layers have few tiles at batch 2"
    for name, layer, cfg in layers:
        assert name == "sd_unet" and layer.groups == 1
        assert 2 * cfg.num_tiles <= 132 and cfg.k_iters >= 2
    assert len({layer.geometry for _, layer, _ in layers}) == len(layers)
    # batch 1 makes ResNet-50's late layers small problems; at its suite batch (32) none is
    assert split_sweep.candidates(["resnet50"], 1, "bfloat16", 132)
    assert not split_sweep.candidates(["resnet50"], None, "bfloat16", 132)


def test_list_and_argument_errors(capsys):
    assert split_sweep.main(["--list", "--network", "sd_unet", "--sm-count", "132"]) == 0
    out = capsys.readouterr().out
    assert "C1280 8x8 -> K1280 3x3 s1 p1" in out and "reduction steps" in out
    for argv in (["--ways", "1"], ["--ways", "17"], ["--batch", "0"], ["--runs", "0"]):
        with pytest.raises(SystemExit):
            split_sweep.main(argv + ["--list"])


def test_report_line_names_the_best_part_count():
    rec = dict(layer="up.0.conv", auto_ms=0.040, ways={2: 0.030, 8: 0.012, 16: 0.015}, parts={2: 2, 8: 8, 16: 9},
               cudnn_ms=0.020)
    text = split_sweep.line(rec)
    assert "best 8 parts: 3.33x of auto" in text and "16:  15.0(9)" in text and "cuDNN   20.0" in text
    assert split_sweep._parts("..., all 14 tiles split 9 ways along the reduction (...)") == 9
    assert split_sweep._parts("..., last wave's 4 tiles split in two along the reduction (...)") == 2
    assert split_sweep._parts("grid 14 CTAs, one tile per CTA") == 1
