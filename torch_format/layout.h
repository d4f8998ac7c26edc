// The tensor layout torch files describe, inside torch_format/: each element
// type's size and names, and the arithmetic of strided views (how far a view
// reaches into its storage, the strides of a contiguous tensor), every
// product and sum checked for overflow since the numbers come from the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "torch_format/torch_file.h"

namespace conveyor::torch_format {

// torch.<name> for a typed storage ("FloatStorage"): its element type, or
// false for a name that is none of TorchDType's.
bool DTypeOfStorage(const std::string& name, TorchDType* dtype);

inline bool MulOverflow(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }
inline bool AddOverflow(int64_t a, int64_t b, int64_t* out) { return __builtin_add_overflow(a, b, out); }

// The number of elements a view reaches past its offset: 1 + sum((n-1)*s),
// or 0 for an empty view; false on overflow or a negative size/stride.
bool ViewExtent(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, int64_t* extent);

// Row-major strides, in elements, for `shape`.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape);

}  // namespace conveyor::torch_format
