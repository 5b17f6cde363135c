"""The conv layers of YOLOv8s at 640x640, batch 16, written from ultralytics' definition.

ultralytics/cfg/models/v8/yolov8.yaml at scale ``s`` (depth 0.33, width 0.50, max_channels 1024),
built by ``ultralytics.nn.tasks.parse_model``: ``Conv`` is a conv (padding k // 2) + BN + SiLU;
``C2f(c1, c2, n)`` runs ``cv1`` (1x1, c1 -> c2), n Bottlenecks of two 3x3 convs on half the channels
(c = c2 / 2), and ``cv2`` (1x1, (2 + n) * c -> c2) on the concatenation; ``SPPF`` a 1x1 conv to c1 / 2,
three 5x5 max pools and a 1x1 conv from 4 * c1 / 2. ``Detect`` (80 classes, reg_max 16) has per
level (P3 128 ch at 80x80, P4 256 at 40x40, P5 512 at 20x20) a box branch ``cv2`` (3x3 -> 64, 3x3
64 -> 64, 1x1 64 -> 64) and a class branch ``cv3`` (3x3 -> 128, 3x3 128 -> 128, 1x1 128 -> 80), then
``DFL``: a fixed 1x1 conv 16 -> 1 over the box distributions viewed as (N, 16, 4, 8400). 64 convs.
"""

from __future__ import annotations

from .layers import conv, network

__all__ = ["YOLOV8S"]

YOLOV8S = network("yolov8s", "YOLOv8s", "ultralytics yolov8.yaml, scale s (depth 0.33, width 0.50)",
                  batch=16, input=(640, 640, 3), convs=[
    # backbone
    conv("model.0 Conv", 640, 3, 32, 3, stride=2),
    conv("model.1 Conv", 320, 32, 64, 3, stride=2),
    conv("model.2 C2f.cv1", 160, 64, 64, 1),
    conv("model.2 C2f.m.0.cv1/cv2", 160, 32, 32, 3, count=2),
    conv("model.2 C2f.cv2", 160, 96, 64, 1),
    conv("model.3 Conv", 160, 64, 128, 3, stride=2),
    conv("model.4 C2f.cv1", 80, 128, 128, 1),
    conv("model.4 C2f.m.0-1.cv1/cv2", 80, 64, 64, 3, count=4),
    conv("model.4 C2f.cv2", 80, 256, 128, 1),
    conv("model.5 Conv", 80, 128, 256, 3, stride=2),
    conv("model.6 C2f.cv1", 40, 256, 256, 1),
    conv("model.6 C2f.m.0-1.cv1/cv2", 40, 128, 128, 3, count=4),
    conv("model.6 C2f.cv2", 40, 512, 256, 1),
    conv("model.7 Conv", 40, 256, 512, 3, stride=2),
    conv("model.8 C2f.cv1", 20, 512, 512, 1),
    conv("model.8 C2f.m.0.cv1/cv2", 20, 256, 256, 3, count=2),
    conv("model.8 C2f.cv2", 20, 768, 512, 1),
    conv("model.9 SPPF.cv1", 20, 512, 256, 1),
    conv("model.9 SPPF.cv2", 20, 1024, 512, 1),
    # head: model.10 upsamples to 40x40, model.11 concatenates model.6 (512 + 256 channels)
    conv("model.12 C2f.cv1", 40, 768, 256, 1),
    conv("model.12 C2f.m.0.cv1/cv2", 40, 128, 128, 3, count=2),
    conv("model.12 C2f.cv2", 40, 384, 256, 1),
    # model.13 upsamples to 80x80, model.14 concatenates model.4 (256 + 128)
    conv("model.15 C2f.cv1", 80, 384, 128, 1),
    conv("model.15 C2f.m.0.cv1/cv2", 80, 64, 64, 3, count=2),
    conv("model.15 C2f.cv2", 80, 192, 128, 1),
    conv("model.16 Conv", 80, 128, 128, 3, stride=2),
    # model.17 concatenates model.12 (128 + 256)
    conv("model.18 C2f.cv1", 40, 384, 256, 1),
    conv("model.18 C2f.m.0.cv1/cv2", 40, 128, 128, 3, count=2),
    conv("model.18 C2f.cv2", 40, 384, 256, 1),
    conv("model.19 Conv", 40, 256, 256, 3, stride=2),
    # model.20 concatenates model.9 (256 + 512)
    conv("model.21 C2f.cv1", 20, 768, 512, 1),
    conv("model.21 C2f.m.0.cv1/cv2", 20, 256, 256, 3, count=2),
    conv("model.21 C2f.cv2", 20, 768, 512, 1),
    # model.22 Detect on P3 (model.15), P4 (model.18), P5 (model.21)
    conv("model.22 Detect.cv2.0.0", 80, 128, 64, 3),
    conv("model.22 Detect.cv2.0.1", 80, 64, 64, 3),
    conv("model.22 Detect.cv2.0.2", 80, 64, 64, 1),
    conv("model.22 Detect.cv3.0.0", 80, 128, 128, 3),
    conv("model.22 Detect.cv3.0.1", 80, 128, 128, 3),
    conv("model.22 Detect.cv3.0.2", 80, 128, 80, 1),
    conv("model.22 Detect.cv2.1.0", 40, 256, 64, 3),
    conv("model.22 Detect.cv2.1.1", 40, 64, 64, 3),
    conv("model.22 Detect.cv2.1.2", 40, 64, 64, 1),
    conv("model.22 Detect.cv3.1.0", 40, 256, 128, 3),
    conv("model.22 Detect.cv3.1.1", 40, 128, 128, 3),
    conv("model.22 Detect.cv3.1.2", 40, 128, 80, 1),
    conv("model.22 Detect.cv2.2.0", 20, 512, 64, 3),
    conv("model.22 Detect.cv2.2.1", 20, 64, 64, 3),
    conv("model.22 Detect.cv2.2.2", 20, 64, 64, 1),
    conv("model.22 Detect.cv3.2.0", 20, 512, 128, 3),
    conv("model.22 Detect.cv3.2.1", 20, 128, 128, 3),
    conv("model.22 Detect.cv3.2.2", 20, 128, 80, 1),
    conv("model.22 Detect.dfl", (4, 8400), 16, 1, 1),
])
