#pragma once
// Argument checks shared by every KVStore implementation, so the local and the distributed
// store reject the same mistakes with the same words. Each throws ps::Error worded as
// "<store>: <op> key <K>: <what is wrong>: expected ..., given ...".
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include <ps/error.h>
#include <ps/tensor.h>

namespace ps::checks {

std::string Where(std::string_view store, std::string_view op, Key key);

// One tensor per key.
void Counts(std::string_view store, std::string_view op, std::size_t keys, std::size_t tensors);

// What any tensor handed to a store must satisfy: a valid dtype, data behind a non-empty view,
// CPU memory unless this build can copy GPU memory (DeviceCopiesBuilt).
void TensorBasics(std::string_view store, std::string_view op, Key key, const Tensor& t);

// Runs work(); a ps::Error from it (a failed GPU copy, say) is rethrown prefixed with
// Where(store, op, key), so the message names the key.
void NamingKey(std::string_view store, std::string_view op, Key key,
               const std::function<void()>& work);

// A Push/Pull tensor against what Init declared for the key.
void Matches(std::string_view store, std::string_view op, Key key, const Tensor& t, DType dtype,
             std::size_t size);

// Init: the dtype must be one a server can sum.
void InitDType(std::string_view store, Key key, DType dtype);

}  // namespace ps::checks
