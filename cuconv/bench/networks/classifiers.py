"""The conv layers of six ImageNet classifiers at 224x224, batch 32, written from torchvision's definitions.

Each list is every ``nn.Conv2d`` of the model's forward pass, in order, with the geometry the
torchvision module builds (channels, filter, stride, padding, groups); repeated blocks carry a
count. Batch norms, activations, pooling and the final ``nn.Linear`` are not convolutions and are
left out, and so are ConvNeXt's pointwise ``nn.Linear`` layers (see :data:`CONVNEXT_TINY`).

The sources: ``torchvision.models.resnet50`` (:data:`RESNET50`), ``mobilenet_v2``
(:data:`MOBILENET_V2`), ``convnext_tiny`` (:data:`CONVNEXT_TINY`), ``efficientnet_b0``
(:data:`EFFICIENTNET_B0`: ``_efficientnet_conf("efficientnet_b0")`` with its ``MBConv`` blocks) and
``resnext50_32x4d`` (:data:`RESNEXT50_32X4D`: ``ResNet(Bottleneck, [3, 4, 6, 3], groups=32,
width_per_group=4)``) and ``shufflenet_v2_x1_0`` (:data:`SHUFFLENET_V2`). MobileNetV2, ConvNeXt-T,
EfficientNet-B0 and ShuffleNetV2 carry depthwise convolutions, ResNeXt-50 grouped ones (32 groups);
ShuffleNetV2's branches of 58 and 116 channels are off the multiples of 8 that most kernels vectorize
over.
"""

from __future__ import annotations

from .layers import conv, network

__all__ = ["RESNET50", "MOBILENET_V2", "CONVNEXT_TINY", "EFFICIENTNET_B0", "RESNEXT50_32X4D", "SHUFFLENET_V2"]

#: torchvision.models.resnet50: ``ResNet(Bottleneck, [3, 4, 6, 3])``, the v1.5 bottleneck (the stride
#: on the 3x3 conv, ``conv2``), stem ``conv1`` 7x7/2 then a 3x3/2 max pool (224 -> 112 -> 56). Each
#: stage's first block has the 1x1 ``downsample`` conv (stride 2 from ``layer2`` on). 53 convs.
RESNET50 = network("resnet50", "ResNet-50", "torchvision.models.resnet50 (Bottleneck, layers [3, 4, 6, 3])",
                   batch=32, input=(224, 224, 3), convs=[
    conv("conv1", 224, 3, 64, 7, stride=2, pad=3),
    # layer1: 3 bottlenecks, width 64, 256 out, at 56x56 (after the max pool)
    conv("layer1.0.conv1", 56, 64, 64, 1),
    conv("layer1.0.conv2", 56, 64, 64, 3),
    conv("layer1.0.conv3", 56, 64, 256, 1),
    conv("layer1.0.downsample", 56, 64, 256, 1),
    conv("layer1.1-2.conv1", 56, 256, 64, 1, count=2),
    conv("layer1.1-2.conv2", 56, 64, 64, 3, count=2),
    conv("layer1.1-2.conv3", 56, 64, 256, 1, count=2),
    # layer2: 4 bottlenecks, width 128, 512 out, 56 -> 28
    conv("layer2.0.conv1", 56, 256, 128, 1),
    conv("layer2.0.conv2", 56, 128, 128, 3, stride=2),
    conv("layer2.0.conv3", 28, 128, 512, 1),
    conv("layer2.0.downsample", 56, 256, 512, 1, stride=2),
    conv("layer2.1-3.conv1", 28, 512, 128, 1, count=3),
    conv("layer2.1-3.conv2", 28, 128, 128, 3, count=3),
    conv("layer2.1-3.conv3", 28, 128, 512, 1, count=3),
    # layer3: 6 bottlenecks, width 256, 1024 out, 28 -> 14
    conv("layer3.0.conv1", 28, 512, 256, 1),
    conv("layer3.0.conv2", 28, 256, 256, 3, stride=2),
    conv("layer3.0.conv3", 14, 256, 1024, 1),
    conv("layer3.0.downsample", 28, 512, 1024, 1, stride=2),
    conv("layer3.1-5.conv1", 14, 1024, 256, 1, count=5),
    conv("layer3.1-5.conv2", 14, 256, 256, 3, count=5),
    conv("layer3.1-5.conv3", 14, 256, 1024, 1, count=5),
    # layer4: 3 bottlenecks, width 512, 2048 out, 14 -> 7
    conv("layer4.0.conv1", 14, 1024, 512, 1),
    conv("layer4.0.conv2", 14, 512, 512, 3, stride=2),
    conv("layer4.0.conv3", 7, 512, 2048, 1),
    conv("layer4.0.downsample", 14, 1024, 2048, 1, stride=2),
    conv("layer4.1-2.conv1", 7, 2048, 512, 1, count=2),
    conv("layer4.1-2.conv2", 7, 512, 512, 3, count=2),
    conv("layer4.1-2.conv3", 7, 512, 2048, 1, count=2),
])

#: torchvision.models.mobilenet_v2 (width 1.0): ``features[0]`` a 3x3/2 conv 3 -> 32, then 17
#: InvertedResidual blocks from the setting (t, c, n, s) = (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2),
#: (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1): a 1x1 expansion to t * C (not when
#: t = 1), a 3x3 depthwise conv (the block's stride on the first of n), a 1x1 projection to c; last
#: ``features[18]`` a 1x1 conv 320 -> 1280. 52 convs.
MOBILENET_V2 = network("mobilenet_v2", "MobileNetV2", "torchvision.models.mobilenet_v2 (width_mult 1.0)",
                       batch=32, input=(224, 224, 3), convs=[
    conv("features.0", 224, 3, 32, 3, stride=2),
    # t=1, c=16: depthwise + projection at 112x112
    conv("features.1.dw", 112, 32, 32, 3, groups=32),
    conv("features.1.project", 112, 32, 16, 1),
    # t=6, c=24, n=2, s=2: 112 -> 56
    conv("features.2.expand", 112, 16, 96, 1),
    conv("features.2.dw", 112, 96, 96, 3, stride=2, groups=96),
    conv("features.2.project", 56, 96, 24, 1),
    conv("features.3.expand", 56, 24, 144, 1),
    conv("features.3.dw", 56, 144, 144, 3, groups=144),
    conv("features.3.project", 56, 144, 24, 1),
    # t=6, c=32, n=3, s=2: 56 -> 28
    conv("features.4.expand", 56, 24, 144, 1),
    conv("features.4.dw", 56, 144, 144, 3, stride=2, groups=144),
    conv("features.4.project", 28, 144, 32, 1),
    conv("features.5-6.expand", 28, 32, 192, 1, count=2),
    conv("features.5-6.dw", 28, 192, 192, 3, groups=192, count=2),
    conv("features.5-6.project", 28, 192, 32, 1, count=2),
    # t=6, c=64, n=4, s=2: 28 -> 14
    conv("features.7.expand", 28, 32, 192, 1),
    conv("features.7.dw", 28, 192, 192, 3, stride=2, groups=192),
    conv("features.7.project", 14, 192, 64, 1),
    conv("features.8-10.expand", 14, 64, 384, 1, count=3),
    conv("features.8-10.dw", 14, 384, 384, 3, groups=384, count=3),
    conv("features.8-10.project", 14, 384, 64, 1, count=3),
    # t=6, c=96, n=3, s=1: 14x14
    conv("features.11.expand", 14, 64, 384, 1),
    conv("features.11.dw", 14, 384, 384, 3, groups=384),
    conv("features.11.project", 14, 384, 96, 1),
    conv("features.12-13.expand", 14, 96, 576, 1, count=2),
    conv("features.12-13.dw", 14, 576, 576, 3, groups=576, count=2),
    conv("features.12-13.project", 14, 576, 96, 1, count=2),
    # t=6, c=160, n=3, s=2: 14 -> 7
    conv("features.14.expand", 14, 96, 576, 1),
    conv("features.14.dw", 14, 576, 576, 3, stride=2, groups=576),
    conv("features.14.project", 7, 576, 160, 1),
    conv("features.15-16.expand", 7, 160, 960, 1, count=2),
    conv("features.15-16.dw", 7, 960, 960, 3, groups=960, count=2),
    conv("features.15-16.project", 7, 960, 160, 1, count=2),
    # t=6, c=320, n=1, s=1: 7x7
    conv("features.17.expand", 7, 160, 960, 1),
    conv("features.17.dw", 7, 960, 960, 3, groups=960),
    conv("features.17.project", 7, 960, 320, 1),
    conv("features.18", 7, 320, 1280, 1),
])

#: torchvision.models.convnext_tiny: depths (3, 3, 9, 3), dims (96, 192, 384, 768). Its convs are the
#: stem (4x4/4, 3 -> 96, 224 -> 56), a 2x2/2 downsampling conv before stages 2-4, and one 7x7
#: depthwise conv (padding 3) per CNBlock: 22 convs. Each CNBlock's two pointwise layers
#: (dim -> 4 dim -> dim) are ``nn.Linear`` on channels-last activations, not convolutions, and are
#: not listed: they hold about 4.16 of the model's 4.46 GMACs per image, the convs about 0.29.
CONVNEXT_TINY = network("convnext_tiny", "ConvNeXt-T",
                        "torchvision.models.convnext_tiny (depths [3, 3, 9, 3], dims [96, 192, 384, 768])",
                        batch=32, input=(224, 224, 3), convs=[
    conv("features.0 (stem)", 224, 3, 96, 4, stride=4, pad=0),
    conv("features.1.dwconv", 56, 96, 96, 7, groups=96, count=3),
    conv("features.2 (downsample)", 56, 96, 192, 2, stride=2, pad=0),
    conv("features.3.dwconv", 28, 192, 192, 7, groups=192, count=3),
    conv("features.4 (downsample)", 28, 192, 384, 2, stride=2, pad=0),
    conv("features.5.dwconv", 14, 384, 384, 7, groups=384, count=9),
    conv("features.6 (downsample)", 14, 384, 768, 2, stride=2, pad=0),
    conv("features.7.dwconv", 7, 768, 768, 7, groups=768, count=3),
])

#: torchvision.models.efficientnet_b0 (width and depth multipliers 1.0): ``features[0]`` a 3x3/2 conv
#: 3 -> 32 (224 -> 112), then 16 MBConv blocks in 7 stages, ``_efficientnet_conf``'s (expand ratio,
#: kernel, stride, in, out, layers) = (1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2),
#: (6, 3, 2, 40, 80, 3), (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1). A block
#: runs a 1x1 expansion to ``expanded = ratio * in`` (not when the ratio is 1), a k x k depthwise conv
#: (padding (k - 1) // 2, the stage's stride on its first block), a squeeze-excitation whose two 1x1
#: convs run on the pooled 1x1 image (``fc1`` expanded -> max(1, in // 4), ``fc2`` back), and a 1x1
#: projection to ``out``; the blocks after a stage's first take ``in = out`` and stride 1. Last
#: ``features[8]`` a 1x1 conv 320 -> 1280. 81 convs.
EFFICIENTNET_B0 = network("efficientnet_b0", "EfficientNet-B0",
                          "torchvision.models.efficientnet_b0 (width_mult 1.0, depth_mult 1.0)",
                          batch=32, input=(224, 224, 3), convs=[
    conv("features.0", 224, 3, 32, 3, stride=2),
    # stage 1: ratio 1, 3x3, 32 -> 16 at 112x112 (no expansion)
    conv("features.1.0.dw", 112, 32, 32, 3, groups=32),
    conv("features.1.0.se.fc1", 1, 32, 8, 1),
    conv("features.1.0.se.fc2", 1, 8, 32, 1),
    conv("features.1.0.project", 112, 32, 16, 1),
    # stage 2: ratio 6, 3x3, 16 -> 24, 2 blocks, 112 -> 56
    conv("features.2.0.expand", 112, 16, 96, 1),
    conv("features.2.0.dw", 112, 96, 96, 3, stride=2, groups=96),
    conv("features.2.0.se.fc1", 1, 96, 4, 1),
    conv("features.2.0.se.fc2", 1, 4, 96, 1),
    conv("features.2.0.project", 56, 96, 24, 1),
    conv("features.2.1.expand", 56, 24, 144, 1),
    conv("features.2.1.dw", 56, 144, 144, 3, groups=144),
    conv("features.2.1.se.fc1", 1, 144, 6, 1),
    conv("features.2.1.se.fc2", 1, 6, 144, 1),
    conv("features.2.1.project", 56, 144, 24, 1),
    # stage 3: ratio 6, 5x5, 24 -> 40, 2 blocks, 56 -> 28
    conv("features.3.0.expand", 56, 24, 144, 1),
    conv("features.3.0.dw", 56, 144, 144, 5, stride=2, groups=144),
    conv("features.3.0.se.fc1", 1, 144, 6, 1),
    conv("features.3.0.se.fc2", 1, 6, 144, 1),
    conv("features.3.0.project", 28, 144, 40, 1),
    conv("features.3.1.expand", 28, 40, 240, 1),
    conv("features.3.1.dw", 28, 240, 240, 5, groups=240),
    conv("features.3.1.se.fc1", 1, 240, 10, 1),
    conv("features.3.1.se.fc2", 1, 10, 240, 1),
    conv("features.3.1.project", 28, 240, 40, 1),
    # stage 4: ratio 6, 3x3, 40 -> 80, 3 blocks, 28 -> 14
    conv("features.4.0.expand", 28, 40, 240, 1),
    conv("features.4.0.dw", 28, 240, 240, 3, stride=2, groups=240),
    conv("features.4.0.se.fc1", 1, 240, 10, 1),
    conv("features.4.0.se.fc2", 1, 10, 240, 1),
    conv("features.4.0.project", 14, 240, 80, 1),
    conv("features.4.1-2.expand", 14, 80, 480, 1, count=2),
    conv("features.4.1-2.dw", 14, 480, 480, 3, groups=480, count=2),
    conv("features.4.1-2.se.fc1", 1, 480, 20, 1, count=2),
    conv("features.4.1-2.se.fc2", 1, 20, 480, 1, count=2),
    conv("features.4.1-2.project", 14, 480, 80, 1, count=2),
    # stage 5: ratio 6, 5x5, 80 -> 112, 3 blocks at 14x14
    conv("features.5.0.expand", 14, 80, 480, 1),
    conv("features.5.0.dw", 14, 480, 480, 5, groups=480),
    conv("features.5.0.se.fc1", 1, 480, 20, 1),
    conv("features.5.0.se.fc2", 1, 20, 480, 1),
    conv("features.5.0.project", 14, 480, 112, 1),
    conv("features.5.1-2.expand", 14, 112, 672, 1, count=2),
    conv("features.5.1-2.dw", 14, 672, 672, 5, groups=672, count=2),
    conv("features.5.1-2.se.fc1", 1, 672, 28, 1, count=2),
    conv("features.5.1-2.se.fc2", 1, 28, 672, 1, count=2),
    conv("features.5.1-2.project", 14, 672, 112, 1, count=2),
    # stage 6: ratio 6, 5x5, 112 -> 192, 4 blocks, 14 -> 7
    conv("features.6.0.expand", 14, 112, 672, 1),
    conv("features.6.0.dw", 14, 672, 672, 5, stride=2, groups=672),
    conv("features.6.0.se.fc1", 1, 672, 28, 1),
    conv("features.6.0.se.fc2", 1, 28, 672, 1),
    conv("features.6.0.project", 7, 672, 192, 1),
    conv("features.6.1-3.expand", 7, 192, 1152, 1, count=3),
    conv("features.6.1-3.dw", 7, 1152, 1152, 5, groups=1152, count=3),
    conv("features.6.1-3.se.fc1", 1, 1152, 48, 1, count=3),
    conv("features.6.1-3.se.fc2", 1, 48, 1152, 1, count=3),
    conv("features.6.1-3.project", 7, 1152, 192, 1, count=3),
    # stage 7: ratio 6, 3x3, 192 -> 320, 1 block at 7x7
    conv("features.7.0.expand", 7, 192, 1152, 1),
    conv("features.7.0.dw", 7, 1152, 1152, 3, groups=1152),
    conv("features.7.0.se.fc1", 1, 1152, 48, 1),
    conv("features.7.0.se.fc2", 1, 48, 1152, 1),
    conv("features.7.0.project", 7, 1152, 320, 1),
    conv("features.8", 7, 320, 1280, 1),
])

#: torchvision.models.resnext50_32x4d: ``ResNet(Bottleneck, [3, 4, 6, 3], groups=32,
#: width_per_group=4)``, the ResNet-50 layout with each bottleneck's width ``planes * 4 / 64 * 32``
#: (128, 256, 512, 1024 for planes 64, 128, 256, 512; 4, 8, 16, 32 channels per group) and its 3x3
#: ``conv2`` grouped 32 ways, carrying the stage's stride; outputs ``4 * planes`` (256 ... 2048) as in
#: ResNet-50. 53 convs.
RESNEXT50_32X4D = network("resnext50_32x4d", "ResNeXt-50 32x4d",
                          "torchvision.models.resnext50_32x4d (Bottleneck, layers [3, 4, 6, 3], groups 32, "
                          "width_per_group 4)", batch=32, input=(224, 224, 3), convs=[
    conv("conv1", 224, 3, 64, 7, stride=2, pad=3),
    # layer1: 3 bottlenecks, width 128, 256 out, at 56x56 (after the max pool)
    conv("layer1.0.conv1", 56, 64, 128, 1),
    conv("layer1.0.conv2", 56, 128, 128, 3, groups=32),
    conv("layer1.0.conv3", 56, 128, 256, 1),
    conv("layer1.0.downsample", 56, 64, 256, 1),
    conv("layer1.1-2.conv1", 56, 256, 128, 1, count=2),
    conv("layer1.1-2.conv2", 56, 128, 128, 3, groups=32, count=2),
    conv("layer1.1-2.conv3", 56, 128, 256, 1, count=2),
    # layer2: 4 bottlenecks, width 256, 512 out, 56 -> 28
    conv("layer2.0.conv1", 56, 256, 256, 1),
    conv("layer2.0.conv2", 56, 256, 256, 3, stride=2, groups=32),
    conv("layer2.0.conv3", 28, 256, 512, 1),
    conv("layer2.0.downsample", 56, 256, 512, 1, stride=2),
    conv("layer2.1-3.conv1", 28, 512, 256, 1, count=3),
    conv("layer2.1-3.conv2", 28, 256, 256, 3, groups=32, count=3),
    conv("layer2.1-3.conv3", 28, 256, 512, 1, count=3),
    # layer3: 6 bottlenecks, width 512, 1024 out, 28 -> 14
    conv("layer3.0.conv1", 28, 512, 512, 1),
    conv("layer3.0.conv2", 28, 512, 512, 3, stride=2, groups=32),
    conv("layer3.0.conv3", 14, 512, 1024, 1),
    conv("layer3.0.downsample", 28, 512, 1024, 1, stride=2),
    conv("layer3.1-5.conv1", 14, 1024, 512, 1, count=5),
    conv("layer3.1-5.conv2", 14, 512, 512, 3, groups=32, count=5),
    conv("layer3.1-5.conv3", 14, 512, 1024, 1, count=5),
    # layer4: 3 bottlenecks, width 1024, 2048 out, 14 -> 7
    conv("layer4.0.conv1", 14, 1024, 1024, 1),
    conv("layer4.0.conv2", 14, 1024, 1024, 3, stride=2, groups=32),
    conv("layer4.0.conv3", 7, 1024, 2048, 1),
    conv("layer4.0.downsample", 14, 1024, 2048, 1, stride=2),
    conv("layer4.1-2.conv1", 7, 2048, 1024, 1, count=2),
    conv("layer4.1-2.conv2", 7, 1024, 1024, 3, groups=32, count=2),
    conv("layer4.1-2.conv3", 7, 1024, 2048, 1, count=2),
])

#: torchvision.models.shufflenet_v2_x1_0: stages_repeats (4, 8, 4), stages_out_channels (24, 116, 232,
#: 464, 1024). ``conv1`` a 3x3/2 conv 3 -> 24 then a 3x3/2 max pool (224 -> 112 -> 56); per stage a
#: stride-2 unit, whose two branches both read the whole input (``branch1``: 3x3/2 depthwise, 1x1;
#: ``branch2``: 1x1, 3x3/2 depthwise, 1x1; each to half the stage's width), then stride-1 units whose
#: ``branch2`` runs on half the channels (the other half passes through; the halves are concatenated
#: and shuffled); last ``conv5``, a 1x1 conv 464 -> 1024 at 7x7. 56 convs.
SHUFFLENET_V2 = network("shufflenet_v2", "ShuffleNetV2 x1.0",
                        "torchvision.models.shufflenet_v2_x1_0 (stages_repeats [4, 8, 4], stages_out_channels "
                        "[24, 116, 232, 464, 1024])", batch=32, input=(224, 224, 3), convs=[
    conv("conv1", 224, 3, 24, 3, stride=2),
    # stage2: 116 channels (branches of 58), 56 -> 28
    conv("stage2.0.branch1.dw", 56, 24, 24, 3, stride=2, groups=24),
    conv("stage2.0.branch1.pw", 28, 24, 58, 1),
    conv("stage2.0.branch2.pw1", 56, 24, 58, 1),
    conv("stage2.0.branch2.dw", 56, 58, 58, 3, stride=2, groups=58),
    conv("stage2.0.branch2.pw2", 28, 58, 58, 1),
    conv("stage2.1-3.branch2.pw1", 28, 58, 58, 1, count=3),
    conv("stage2.1-3.branch2.dw", 28, 58, 58, 3, groups=58, count=3),
    conv("stage2.1-3.branch2.pw2", 28, 58, 58, 1, count=3),
    # stage3: 232 channels (branches of 116), 28 -> 14
    conv("stage3.0.branch1.dw", 28, 116, 116, 3, stride=2, groups=116),
    conv("stage3.0.branch1.pw", 14, 116, 116, 1),
    conv("stage3.0.branch2.pw1", 28, 116, 116, 1),
    conv("stage3.0.branch2.dw", 28, 116, 116, 3, stride=2, groups=116),
    conv("stage3.0.branch2.pw2", 14, 116, 116, 1),
    conv("stage3.1-7.branch2.pw1", 14, 116, 116, 1, count=7),
    conv("stage3.1-7.branch2.dw", 14, 116, 116, 3, groups=116, count=7),
    conv("stage3.1-7.branch2.pw2", 14, 116, 116, 1, count=7),
    # stage4: 464 channels (branches of 232), 14 -> 7
    conv("stage4.0.branch1.dw", 14, 232, 232, 3, stride=2, groups=232),
    conv("stage4.0.branch1.pw", 7, 232, 232, 1),
    conv("stage4.0.branch2.pw1", 14, 232, 232, 1),
    conv("stage4.0.branch2.dw", 14, 232, 232, 3, stride=2, groups=232),
    conv("stage4.0.branch2.pw2", 7, 232, 232, 1),
    conv("stage4.1-3.branch2.pw1", 7, 232, 232, 1, count=3),
    conv("stage4.1-3.branch2.dw", 7, 232, 232, 3, groups=232, count=3),
    conv("stage4.1-3.branch2.pw2", 7, 232, 232, 1, count=3),
    conv("conv5", 7, 464, 1024, 1),
])
