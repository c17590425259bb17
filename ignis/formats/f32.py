"""weight_format="f32": the matmuls read the model's weights as f32 (exact; the default). Nothing
is converted: the Executor's `weights` are these arrays."""
from __future__ import annotations

import numpy as np

from .base import Packing, WeightFormat

F32 = Packing("f32", c_id=0, dtype=np.dtype(np.float32),
              packed_bytes=lambda n, k, layout=0: 4 * n * k)

FORMAT = WeightFormat("f32", "f32 (exact)")
