"""course_attn: the tested helper package of the attention course.

Each public name states in its docstring the chapter that derives it.
"""

from .env import environment_report, pick_device, seed_everything
from .softmax import attention_pool, softmax

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "attention_pool",
    "environment_report",
    "pick_device",
    "seed_everything",
    "softmax",
]
