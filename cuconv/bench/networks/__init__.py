"""The networks suite: every conv layer of nine networks, run as a forward pass runs them, against cuDNN.

``python -m cuconv.bench --suite networks [--network NAME ...]``. The layer lists are data
(:mod:`.classifiers`, :mod:`.diffusion`, :mod:`.yolo`; :mod:`.layers` for the format), each written
from the definition it names; only convolutions are listed.

======================  ==========  =============================================================
name                    batch       source
======================  ==========  =============================================================
``resnet50``            32, 224px   torchvision.models.resnet50
``mobilenet_v2``        32, 224px   torchvision.models.mobilenet_v2
``sd_vae_decoder``      1, 64x64    diffusers AutoencoderKL (SD 1.5): post_quant_conv + decoder
                        latent      (-> 512x512)
``sd_unet``             2, 64x64    diffusers UNet2DConditionModel (SD 1.5)
                        latent
``yolov8s``             16, 640px   ultralytics yolov8.yaml, scale s
``convnext_tiny``       32, 224px   torchvision.models.convnext_tiny
``efficientnet_b0``     32, 224px   torchvision.models.efficientnet_b0
``resnext50_32x4d``     32, 224px   torchvision.models.resnext50_32x4d
``shufflenet_v2``       32, 224px   torchvision.models.shufflenet_v2_x1_0
======================  ==========  =============================================================

:mod:`.runner` checks and times them on the GPU; :mod:`.output` prints the tables and draws the
chart. Importing the package needs neither CuPy nor a GPU.
"""

from __future__ import annotations

from typing import Dict

from .classifiers import CONVNEXT_TINY, EFFICIENTNET_B0, MOBILENET_V2, RESNET50, RESNEXT50_32X4D, SHUFFLENET_V2
from .diffusion import SD_UNET, SD_VAE_DECODER
from .layers import Layer, Network, conv, network
from .yolo import YOLOV8S

__all__ = ["Layer", "Network", "NETWORKS", "conv", "network"]

#: The networks of the suite by name, in the order the suite runs them.
NETWORKS: Dict[str, Network] = {n.name: n for n in (RESNET50, MOBILENET_V2, SD_VAE_DECODER, SD_UNET, YOLOV8S,
                                                     CONVNEXT_TINY, EFFICIENTNET_B0, RESNEXT50_32X4D, SHUFFLENET_V2)}
