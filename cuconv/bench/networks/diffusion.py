"""The conv layers of Stable Diffusion 1.5's VAE decoder and UNet, written from diffusers' definitions.

Both at the 64x64 latent of a 512x512 image. Each list is every ``nn.Conv2d`` of the forward pass,
in order, with the geometry diffusers builds from the SD 1.5 configs; repeated blocks carry a count.
Group norms, activations, attention (``nn.Linear``), the nearest-neighbour upsampling itself and the
time embedding are not convolutions and are left out.
"""

from __future__ import annotations

from .layers import conv, network

__all__ = ["SD_VAE_DECODER", "SD_UNET"]

#: diffusers.AutoencoderKL.decode with the SD 1.5 config (block_out_channels [128, 256, 512, 512],
#: layers_per_block 2, latent_channels 4): ``post_quant_conv`` (1x1), then ``Decoder``: ``conv_in``
#: 4 -> 512, the mid block's two ResnetBlock2D (attention between them has no conv), four
#: UpDecoderBlock2D of three ResnetBlock2D each (512, 512, 256, 128 channels; a 1x1 ``conv_shortcut``
#: where a block changes the width) with an Upsample2D conv (3x3, after the 2x nearest upsampling) after
#: the first three, and ``conv_out`` 128 -> 3 at 512x512. Batch 1, 36 convs.
SD_VAE_DECODER = network("sd_vae_decoder", "SD VAE decoder",
                         "diffusers.AutoencoderKL (Stable Diffusion 1.5 config), post_quant_conv + Decoder",
                         batch=1, input=(64, 64, 4), convs=[
    conv("post_quant_conv", 64, 4, 4, 1),
    conv("decoder.conv_in", 64, 4, 512, 3),
    conv("mid_block.resnets.0-1.conv1/conv2", 64, 512, 512, 3, count=4),
    conv("up_blocks.0.resnets.0-2.conv1/conv2", 64, 512, 512, 3, count=6),
    conv("up_blocks.0.upsamplers.0.conv", 128, 512, 512, 3),
    conv("up_blocks.1.resnets.0-2.conv1/conv2", 128, 512, 512, 3, count=6),
    conv("up_blocks.1.upsamplers.0.conv", 256, 512, 512, 3),
    conv("up_blocks.2.resnets.0.conv1", 256, 512, 256, 3),
    conv("up_blocks.2.resnets.0.conv2", 256, 256, 256, 3),
    conv("up_blocks.2.resnets.0.conv_shortcut", 256, 512, 256, 1),
    conv("up_blocks.2.resnets.1-2.conv1/conv2", 256, 256, 256, 3, count=4),
    conv("up_blocks.2.upsamplers.0.conv", 512, 256, 256, 3),
    conv("up_blocks.3.resnets.0.conv1", 512, 256, 128, 3),
    conv("up_blocks.3.resnets.0.conv2", 512, 128, 128, 3),
    conv("up_blocks.3.resnets.0.conv_shortcut", 512, 256, 128, 1),
    conv("up_blocks.3.resnets.1-2.conv1/conv2", 512, 128, 128, 3, count=4),
    conv("decoder.conv_out", 512, 128, 3, 3),
])

#: diffusers.UNet2DConditionModel with the SD 1.5 config (block_out_channels [320, 640, 1280, 1280],
#: layers_per_block 2, three CrossAttnDownBlock2D then a DownBlock2D, a UNetMidBlock2DCrossAttn, an
#: UpBlock2D then three CrossAttnUpBlock2D, ``use_linear_projection`` false). Its convs: ``conv_in``
#: 4 -> 320; two ResnetBlock2D per down block (conv1, conv2, a 1x1 ``conv_shortcut`` where the width
#: changes) and three per up block, whose input is the previous output concatenated with a skip
#: (2560, 1920, 1280, 960 or 640 channels); each Transformer2DModel's 1x1 ``proj_in`` and ``proj_out``
#: (convs in SD 1.5); the 3x3/2 Downsample2D convs and 3x3 Upsample2D convs; ``conv_out`` 320 -> 4.
#: Batch 2 (classifier-free guidance), 98 convs.
SD_UNET = network("sd_unet", "SD UNet", "diffusers.UNet2DConditionModel (Stable Diffusion 1.5 config)",
                  batch=2, input=(64, 64, 4), convs=[
    conv("conv_in", 64, 4, 320, 3),
    # down_blocks.0 (CrossAttnDownBlock2D, 320) at 64x64: (resnet, transformer) x 2, downsampler
    conv("down_blocks.0.resnets.0.conv1/conv2", 64, 320, 320, 3, count=2),
    conv("down_blocks.0.attentions.0.proj_in/proj_out", 64, 320, 320, 1, count=2),
    conv("down_blocks.0.resnets.1.conv1/conv2", 64, 320, 320, 3, count=2),
    conv("down_blocks.0.attentions.1.proj_in/proj_out", 64, 320, 320, 1, count=2),
    conv("down_blocks.0.downsamplers.0.conv", 64, 320, 320, 3, stride=2),
    # down_blocks.1 (CrossAttnDownBlock2D, 640) at 32x32
    conv("down_blocks.1.resnets.0.conv1", 32, 320, 640, 3),
    conv("down_blocks.1.resnets.0.conv2", 32, 640, 640, 3),
    conv("down_blocks.1.resnets.0.conv_shortcut", 32, 320, 640, 1),
    conv("down_blocks.1.attentions.0.proj_in/proj_out", 32, 640, 640, 1, count=2),
    conv("down_blocks.1.resnets.1.conv1/conv2", 32, 640, 640, 3, count=2),
    conv("down_blocks.1.attentions.1.proj_in/proj_out", 32, 640, 640, 1, count=2),
    conv("down_blocks.1.downsamplers.0.conv", 32, 640, 640, 3, stride=2),
    # down_blocks.2 (CrossAttnDownBlock2D, 1280) at 16x16
    conv("down_blocks.2.resnets.0.conv1", 16, 640, 1280, 3),
    conv("down_blocks.2.resnets.0.conv2", 16, 1280, 1280, 3),
    conv("down_blocks.2.resnets.0.conv_shortcut", 16, 640, 1280, 1),
    conv("down_blocks.2.attentions.0.proj_in/proj_out", 16, 1280, 1280, 1, count=2),
    conv("down_blocks.2.resnets.1.conv1/conv2", 16, 1280, 1280, 3, count=2),
    conv("down_blocks.2.attentions.1.proj_in/proj_out", 16, 1280, 1280, 1, count=2),
    conv("down_blocks.2.downsamplers.0.conv", 16, 1280, 1280, 3, stride=2),
    # down_blocks.3 (DownBlock2D, 1280) at 8x8: two resnets, no downsampler
    conv("down_blocks.3.resnets.0-1.conv1/conv2", 8, 1280, 1280, 3, count=4),
    # mid_block (UNetMidBlock2DCrossAttn) at 8x8: resnet, transformer, resnet
    conv("mid_block.resnets.0.conv1/conv2", 8, 1280, 1280, 3, count=2),
    conv("mid_block.attentions.0.proj_in/proj_out", 8, 1280, 1280, 1, count=2),
    conv("mid_block.resnets.1.conv1/conv2", 8, 1280, 1280, 3, count=2),
    # up_blocks.0 (UpBlock2D, 1280) at 8x8: each resnet's input is 1280 + a 1280 skip
    conv("up_blocks.0.resnets.0.conv1", 8, 2560, 1280, 3),
    conv("up_blocks.0.resnets.0.conv2", 8, 1280, 1280, 3),
    conv("up_blocks.0.resnets.0.conv_shortcut", 8, 2560, 1280, 1),
    conv("up_blocks.0.resnets.1.conv1", 8, 2560, 1280, 3),
    conv("up_blocks.0.resnets.1.conv2", 8, 1280, 1280, 3),
    conv("up_blocks.0.resnets.1.conv_shortcut", 8, 2560, 1280, 1),
    conv("up_blocks.0.resnets.2.conv1", 8, 2560, 1280, 3),
    conv("up_blocks.0.resnets.2.conv2", 8, 1280, 1280, 3),
    conv("up_blocks.0.resnets.2.conv_shortcut", 8, 2560, 1280, 1),
    conv("up_blocks.0.upsamplers.0.conv", 16, 1280, 1280, 3),
    # up_blocks.1 (CrossAttnUpBlock2D, 1280) at 16x16: skips of 1280, 1280 and 640 channels
    conv("up_blocks.1.resnets.0.conv1", 16, 2560, 1280, 3),
    conv("up_blocks.1.resnets.0.conv2", 16, 1280, 1280, 3),
    conv("up_blocks.1.resnets.0.conv_shortcut", 16, 2560, 1280, 1),
    conv("up_blocks.1.attentions.0.proj_in/proj_out", 16, 1280, 1280, 1, count=2),
    conv("up_blocks.1.resnets.1.conv1", 16, 2560, 1280, 3),
    conv("up_blocks.1.resnets.1.conv2", 16, 1280, 1280, 3),
    conv("up_blocks.1.resnets.1.conv_shortcut", 16, 2560, 1280, 1),
    conv("up_blocks.1.attentions.1.proj_in/proj_out", 16, 1280, 1280, 1, count=2),
    conv("up_blocks.1.resnets.2.conv1", 16, 1920, 1280, 3),
    conv("up_blocks.1.resnets.2.conv2", 16, 1280, 1280, 3),
    conv("up_blocks.1.resnets.2.conv_shortcut", 16, 1920, 1280, 1),
    conv("up_blocks.1.attentions.2.proj_in/proj_out", 16, 1280, 1280, 1, count=2),
    conv("up_blocks.1.upsamplers.0.conv", 32, 1280, 1280, 3),
    # up_blocks.2 (CrossAttnUpBlock2D, 640) at 32x32: inputs 1280 + 640, 640 + 640, 640 + 320
    conv("up_blocks.2.resnets.0.conv1", 32, 1920, 640, 3),
    conv("up_blocks.2.resnets.0.conv2", 32, 640, 640, 3),
    conv("up_blocks.2.resnets.0.conv_shortcut", 32, 1920, 640, 1),
    conv("up_blocks.2.attentions.0.proj_in/proj_out", 32, 640, 640, 1, count=2),
    conv("up_blocks.2.resnets.1.conv1", 32, 1280, 640, 3),
    conv("up_blocks.2.resnets.1.conv2", 32, 640, 640, 3),
    conv("up_blocks.2.resnets.1.conv_shortcut", 32, 1280, 640, 1),
    conv("up_blocks.2.attentions.1.proj_in/proj_out", 32, 640, 640, 1, count=2),
    conv("up_blocks.2.resnets.2.conv1", 32, 960, 640, 3),
    conv("up_blocks.2.resnets.2.conv2", 32, 640, 640, 3),
    conv("up_blocks.2.resnets.2.conv_shortcut", 32, 960, 640, 1),
    conv("up_blocks.2.attentions.2.proj_in/proj_out", 32, 640, 640, 1, count=2),
    conv("up_blocks.2.upsamplers.0.conv", 64, 640, 640, 3),
    # up_blocks.3 (CrossAttnUpBlock2D, 320) at 64x64: inputs 640 + 320, 320 + 320, 320 + 320
    conv("up_blocks.3.resnets.0.conv1", 64, 960, 320, 3),
    conv("up_blocks.3.resnets.0.conv2", 64, 320, 320, 3),
    conv("up_blocks.3.resnets.0.conv_shortcut", 64, 960, 320, 1),
    conv("up_blocks.3.attentions.0.proj_in/proj_out", 64, 320, 320, 1, count=2),
    conv("up_blocks.3.resnets.1.conv1", 64, 640, 320, 3),
    conv("up_blocks.3.resnets.1.conv2", 64, 320, 320, 3),
    conv("up_blocks.3.resnets.1.conv_shortcut", 64, 640, 320, 1),
    conv("up_blocks.3.attentions.1.proj_in/proj_out", 64, 320, 320, 1, count=2),
    conv("up_blocks.3.resnets.2.conv1", 64, 640, 320, 3),
    conv("up_blocks.3.resnets.2.conv2", 64, 320, 320, 3),
    conv("up_blocks.3.resnets.2.conv_shortcut", 64, 640, 320, 1),
    conv("up_blocks.3.attentions.2.proj_in/proj_out", 64, 320, 320, 1, count=2),
    conv("conv_out", 64, 320, 4, 3),
])
