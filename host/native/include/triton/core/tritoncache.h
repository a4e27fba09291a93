/* modelhost: tritoncache.h
 *
 * Declarations of the TRITONCACHE API: what a cache library implements (TRITONCACHE_ISPEC) and the cache-entry and copy functions the server provides (TRITONCACHE_DECLSPEC).
 *
 * Names, signatures, enum values and API version numbers follow the public
 * interface of NVIDIA Triton Inference Server, so that backends and caches built
 * against Triton's headers link and run against modelhost's bridge unchanged
 * (host/native/src). What each call means is described in Triton's documentation;
 * where the bridge differs, host/native/src says so next to the implementation.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "triton/core/tritonserver.h"
#ifdef __cplusplus
extern "C" {
#endif
#ifdef _COMPILING_TRITONCACHE
#if defined(_MSC_VER)
#define TRITONCACHE_DECLSPEC __declspec(dllexport)
#define TRITONCACHE_ISPEC __declspec(dllimport)
#elif defined(__GNUC__)
#define TRITONCACHE_DECLSPEC __attribute__((__visibility__("default")))
#define TRITONCACHE_ISPEC
#else
#define TRITONCACHE_DECLSPEC
#define TRITONCACHE_ISPEC
#endif
#else
#if defined(_MSC_VER)
#define TRITONCACHE_DECLSPEC __declspec(dllimport)
#define TRITONCACHE_ISPEC __declspec(dllexport)
#else
#define TRITONCACHE_DECLSPEC
#define TRITONCACHE_ISPEC
#endif
#endif
struct TRITONCACHE_Cache;
struct TRITONCACHE_CacheEntry;
struct TRITONCACHE_Allocator;
/* C needs the typedefs that C++ implies. */
typedef struct TRITONCACHE_Cache TRITONCACHE_Cache;
typedef struct TRITONCACHE_CacheEntry TRITONCACHE_CacheEntry;
typedef struct TRITONCACHE_Allocator TRITONCACHE_Allocator;
#define TRITONCACHE_API_VERSION_MAJOR 0
#define TRITONCACHE_API_VERSION_MINOR 1
TRITONCACHE_DECLSPEC TRITONSERVER_Error* TRITONCACHE_ApiVersion(
    uint32_t* major, uint32_t* minor);
TRITONCACHE_DECLSPEC TRITONSERVER_Error* TRITONCACHE_CacheEntryBufferCount(
    TRITONCACHE_CacheEntry* entry, size_t* count);
TRITONCACHE_DECLSPEC TRITONSERVER_Error* TRITONCACHE_CacheEntryAddBuffer(
    TRITONCACHE_CacheEntry* entry, void* base,
    TRITONSERVER_BufferAttributes* buffer_attributes);
TRITONCACHE_DECLSPEC TRITONSERVER_Error* TRITONCACHE_CacheEntryGetBuffer(
    TRITONCACHE_CacheEntry* entry, size_t index, void** base,
    TRITONSERVER_BufferAttributes* buffer_attributes);
TRITONCACHE_DECLSPEC TRITONSERVER_Error* TRITONCACHE_CacheEntrySetBuffer(
    TRITONCACHE_CacheEntry* entry, size_t index, void* new_base,
    TRITONSERVER_BufferAttributes* buffer_attributes);
TRITONCACHE_DECLSPEC TRITONSERVER_Error* TRITONCACHE_Copy(
    TRITONCACHE_Allocator* allocator, TRITONCACHE_CacheEntry* entry);
TRITONCACHE_ISPEC TRITONSERVER_Error* TRITONCACHE_CacheInitialize(
    TRITONCACHE_Cache** cache, const char* config);
TRITONCACHE_ISPEC TRITONSERVER_Error* TRITONCACHE_CacheFinalize(
    TRITONCACHE_Cache* cache);
TRITONCACHE_ISPEC TRITONSERVER_Error* TRITONCACHE_CacheInsert(
    TRITONCACHE_Cache* cache, const char* key, TRITONCACHE_CacheEntry* entry,
    TRITONCACHE_Allocator* allocator);
TRITONCACHE_ISPEC TRITONSERVER_Error* TRITONCACHE_CacheLookup(
    TRITONCACHE_Cache* cache, const char* key, TRITONCACHE_CacheEntry* entry,
    TRITONCACHE_Allocator* allocator);
#ifdef __cplusplus
}
#endif
