// Stand-in for <cuda_runtime.h> when build_tree.cuh is compiled for the CPU emulator (simt_emu.h).
#pragma once
#include "../simt_emu.h"
