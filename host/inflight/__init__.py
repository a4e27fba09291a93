"""In-flight batching: a batch manager for token generation (see docs/inflight.md).

Needs PyTorch; importing this package imports torch.
"""

from host.inflight.kv_cache import KVCacheConfig
from host.inflight.manager import BatchManager
from host.inflight.model import DecoderConfig, TinyDecoder
from host.inflight.request import GenerationRequest, SamplingParams
from host.inflight.scheduler import CapacityPolicy, SchedulerConfig

__all__ = ["BatchManager", "CapacityPolicy", "DecoderConfig", "GenerationRequest", "KVCacheConfig",
           "SamplingParams", "SchedulerConfig", "TinyDecoder"]
