"""FP8 layers for torch models (the extra ``torch``); see ``vtnumba.torch.linear``."""

import torch
from torch import nn

from .linear import *  # noqa: F401,F403
from .linear import __all__  # noqa: F401
