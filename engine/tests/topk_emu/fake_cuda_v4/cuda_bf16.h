// Stand-in for <cuda_bf16.h> in the v4 CPU emulation: the same bf16 storage type as the v3 emulation.
#pragma once
#include "../fake_cuda/cuda_bf16.h"
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
