"""DDTree engine: CUDA kernels of libddtree as torch ops (`ddtree_engine.ops`) and readable pure-PyTorch
references with the same signatures (`ddtree_engine.reference`).

Importing this package loads neither torch's CUDA state nor the library; `ops` load libddtree on
first call (see `_lib.candidate_paths`)."""

from ddtree_engine._lib import (
    DdtreeDeviceError,
    DdtreeError,
    DdtreeLibraryError,
    build_info,
    library_path,
)

__all__ = ["DdtreeDeviceError", "DdtreeError", "DdtreeLibraryError", "build_info", "library_path"]
