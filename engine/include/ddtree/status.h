/* Status codes, error flags and shared ABI types of libddtree (C ABI, usable from C and C++).
 *
 * Every launcher returns a ddtree_status_t synchronously: it validates its arguments and checks the
 * launch, but never waits for the GPU. Faults that only the GPU can see (NaN logits, out-of-range
 * indices in device tensors) are reported by OR-ing DDTREE_FLAG_* bits into an optional device-side
 * int32 word (`error_flags`) that the caller reads whenever it chooses to synchronize. */
#ifndef DDTREE_STATUS_H_
#define DDTREE_STATUS_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define DDTREE_API __declspec(dllexport)
#else
#define DDTREE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ddtree_status {
  DDTREE_STATUS_SUCCESS = 0,
  DDTREE_STATUS_INVALID_ARGUMENT = 1, /* a shape, stride, pointer or value the op cannot take */
  DDTREE_STATUS_CUDA_ERROR = 2,       /* a CUDA call or kernel launch failed */
  DDTREE_STATUS_NO_KERNEL_IMAGE = 3,  /* the library was not built for this GPU's architecture */
  DDTREE_STATUS_WORKSPACE_TOO_SMALL = 4,
  DDTREE_STATUS_UNSUPPORTED = 5,      /* a valid request this build does not implement */
  DDTREE_STATUS_INTERNAL = 6
} ddtree_status_t;

/* Bits OR-ed into the device-side error word by kernels. */
#define DDTREE_FLAG_NAN_INPUT 0x1   /* NaN in logits: the row's outputs are NaN / -1 */
#define DDTREE_FLAG_BAD_INDEX 0x2   /* an index in a device tensor was out of range and was ignored */

/* Element types of floating-point tensors. */
typedef enum ddtree_dtype {
  DDTREE_DTYPE_FLOAT32 = 0,
  DDTREE_DTYPE_BFLOAT16 = 1,
  DDTREE_DTYPE_FLOAT16 = 2
} ddtree_dtype_t;

/* Message of the last failed call on this thread ("" after a success). Valid until the next call. */
DDTREE_API const char* ddtree_last_error(void);

/* Static name of a status code, e.g. "DDTREE_STATUS_INVALID_ARGUMENT". */
DDTREE_API const char* ddtree_status_string(ddtree_status_t status);

/* Version and the CUDA architectures the library was compiled for (e.g. "ddtree 0.1 archs=90;120"). */
DDTREE_API const char* ddtree_build_info(void);

/* SUCCESS if the current device can run this library's kernels, else NO_KERNEL_IMAGE or CUDA_ERROR
 * with a message naming the device's compute capability. Does not synchronize. */
DDTREE_API ddtree_status_t ddtree_check_device(void);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_STATUS_H_ */
