// Stand-in for <cuda_runtime.h> when draft_topk_lse_v4.cuh is compiled for the CPU: the cluster emulator.
#pragma once
#include "../cluster_emu.h"
