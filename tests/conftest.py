"""Test-session settings: one torch thread.

The suite is hundreds of tiny forward/backward passes; on the 2-core CI machine intra-op
threading only adds synchronisation cost (measured: a small step 0.18 ms with one thread vs
tens of ms with two when the other core is busy). Results do not depend on it.
"""

import torch

torch.set_num_threads(1)
