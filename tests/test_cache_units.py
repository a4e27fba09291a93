"""The cache's pure parts: the key, the entry codec (strict decoding), the local LRU table, the
`--cache-config` parsing. (What a server does with them is tests/test_cache.py.)"""

from __future__ import annotations

import pickle
import struct
import threading

import numpy as np
import pytest

from host.cache import codec
from host.cache.key import DEVICE_PARAMETER, cacheable_request, request_key
from host.cache.local import LocalCache, entry_cost
from host.cli import _cache_setting, cache_config
from host.errors import InvalidArgumentError
from host.inference import InferenceRequest, Tensor


def request(*tensors: Tensor, **parameters) -> InferenceRequest:
    return InferenceRequest("m", inputs={t.name: t for t in tensors}, parameters=parameters)


def int32(name: str, values: np.ndarray) -> Tensor:
    return Tensor(name, "INT32", list(values.shape), values.astype(np.int32))


DATA = np.arange(16, dtype=np.int32)


def test_key_is_128_bits_and_stable():
    k = request_key("m", 1, request(int32("X", DATA)))
    assert len(k) == 16
    assert k == request_key("m", 1, request(int32("X", DATA.copy())))


@pytest.mark.parametrize("other", [
    lambda: ("m", 1, request(int32("X", DATA.reshape(4, 4)))),                       # shape
    lambda: ("m", 1, request(Tensor("X", "FP32", [16], DATA.view(np.float32)))),    # datatype
    lambda: ("m", 1, request(Tensor("X", "UINT32", [16], DATA.view(np.uint32)))),   # datatype
    lambda: ("m", 1, request(int32("Y", DATA))),                                     # input name
    lambda: ("m", 2, request(int32("X", DATA))),                                     # version
    lambda: ("n", 1, request(int32("X", DATA))),                                     # model
    lambda: ("m", 1, request(int32("X", DATA + 1))),                                 # bytes
    lambda: ("m", 1, request(int32("X", DATA), temperature=1)),                      # parameters
])
def test_key_separates_what_differs(other):
    assert request_key("m", 1, request(int32("X", DATA))) != request_key(*other())


def test_key_ignores_input_order_and_frames_unambiguously():
    a, b = int32("A", DATA[:8]), int32("B", DATA[8:])
    assert request_key("m", 1, request(a, b)) == request_key("m", 1, request(b, a))
    # "AB" + "" must not frame like "A" + "B"
    s1 = request(Tensor("X", "BYTES", [2], np.array([b"AB", b""], dtype=object)))
    s2 = request(Tensor("X", "BYTES", [2], np.array([b"A", b"B"], dtype=object)))
    assert request_key("m", 1, s1) != request_key("m", 1, s2)


def test_inputs_outside_cpu_memory_are_not_cacheable():
    t = int32("X", DATA)
    assert cacheable_request(request(t))
    t.parameters[DEVICE_PARAMETER] = "cuda"
    assert not cacheable_request(request(t))


def test_codec_round_trip_every_kind():
    outputs = [int32("I", DATA.reshape(2, 8)),
               Tensor("F", "FP64", [3], np.array([1.5, -2, 3])),
               Tensor("S", "BYTES", [2], np.array([b"x\x00y", b""], dtype=object)),
               Tensor("E", "FP32", [0, 4], np.zeros((0, 4), np.float32))]
    back = codec.decode_entry(codec.encode_entry(outputs))
    for want, got in zip(outputs, back):
        assert (got.name, got.datatype, got.shape) == (want.name, want.datatype, want.shape)
        np.testing.assert_array_equal(got.data, want.data)


class _Evil:
    def __reduce__(self):
        return (exec, ("raise SystemExit('pickle ran')",))


def _buffer() -> bytes:
    return codec.encode_tensor(int32("O", DATA))


@pytest.mark.parametrize("poison", [
    pickle.dumps(_Evil()),                                  # a pickle: never unpickled
    b"",                                                    # empty
    _buffer()[:10],                                         # truncated header
    _buffer()[:-1],                                         # truncated data
    _buffer() + b"\x00",                                    # trailing bytes
    b"XXXX" + _buffer()[4:],                                # bad magic
    _buffer()[:4] + bytes([200]) + _buffer()[5:],           # datatype code out of range
    _buffer()[:5] + bytes([65]) + _buffer()[6:],            # rank beyond the limit
    # a header that claims 2**60 data bytes
    _buffer()[:8] + struct.pack("<Q", 2**60) + _buffer()[16:],
    # a dimension that does not match the data size
    _buffer()[:16] + struct.pack("<q", 17) + _buffer()[24:],
    _buffer()[:16] + struct.pack("<q", -16) + _buffer()[24:],
])
def test_codec_rejects_malformed_buffers(poison):
    with pytest.raises(codec.CorruptEntryError):
        codec.decode_entry([poison])


def test_codec_rejects_bad_bytes_framing_and_duplicate_names():
    buf = codec.encode_tensor(Tensor("S", "BYTES", [1], np.array([b"abc"], dtype=object)))
    with pytest.raises(codec.CorruptEntryError):
        codec.decode_entry([buf[:-7] + struct.pack("<I", 999) + b"abc"])  # element overruns
    with pytest.raises(codec.CorruptEntryError, match="twice"):
        codec.decode_entry([_buffer(), _buffer()])


def test_local_lru_bound_and_eviction_order():
    entry = [b"x" * 1000]
    cost = entry_cost(entry)
    cache = LocalCache(2 * cost + cost // 2)  # room for two
    keys = [bytes([i]) * 16 for i in range(3)]
    cache.insert(keys[0], entry)
    cache.insert(keys[1], entry)
    assert cache.lookup(keys[0]) is not None  # 0 is now the most recent
    cache.insert(keys[2], entry)              # evicts 1
    assert cache.lookup(keys[1]) is None
    assert cache.lookup(keys[0]) is not None and cache.lookup(keys[2]) is not None
    assert cache.used == 2 * cost <= cache.size
    cache.insert(keys[2], [b"y" * 10])         # replacing an entry re-counts its bytes
    assert cache.used == cost + entry_cost([b"y" * 10])


def test_local_too_large_entry_and_too_small_size():
    cache = LocalCache(1024)
    with pytest.raises(InvalidArgumentError, match="Requested byte_size: 2096 is greater than "
                                                   "total cache size: 1024"):
        cache.insert(b"k" * 16, [b"x" * 2000])
    assert cache.lookup(b"k" * 16) is None and cache.used == 0
    LocalCache(192)  # Triton 2.51's smallest local cache
    with pytest.raises(InvalidArgumentError, match="Failed to initialize LocalCache: .*at least 192"):
        LocalCache(191)


def test_local_is_thread_safe():
    entry = [b"x" * 100]
    cache = LocalCache(50 * entry_cost(entry))

    def work(seed: int) -> None:
        for i in range(2000):
            key = bytes([(seed * 7 + i) % 256]) * 16
            if cache.lookup(key) is None:
                cache.insert(key, entry)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.used == len(cache) * entry_cost(entry) <= cache.size


def test_cache_config_flags():
    settings = [_cache_setting("redis,host=127.0.0.1"), _cache_setting("redis,port=6379"),
                _cache_setting("redis,password=a,b=c")]
    assert cache_config(settings, None) == {
        "redis": {"host": "127.0.0.1", "port": "6379", "password": "a,b=c"}}
    assert cache_config([], 4096) == {"local": {"size": "4096"}}
    assert cache_config([], 0) == {}
    with pytest.raises(SystemExit):
        cache_config(settings, 4096)
    for bad in ("local", "local,size", ",size=1", "local,=1"):
        with pytest.raises(Exception, match="expected <cache name>"):
            _cache_setting(bad)
