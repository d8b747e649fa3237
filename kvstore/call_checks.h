#pragma once
// Argument checks shared by every KVStore implementation, so the local and the distributed
// store reject the same mistakes with the same words, in the same order (docs/kvstore.md: a
// bad call fails everywhere alike). Each throws ps::Error worded as
// "<store>: <op> key <K>: <what is wrong>: expected ..., given ..."; only <store> ("local
// kvstore", "dist kvstore") differs between the stores. tests/kvstore/test_store_agreement.cc
// makes the same bad calls on "local" and "dist_sync" and compares the messages.
#include <cstddef>
#include <functional>
#include <memory_resource>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>

#include "ps/error.h"
#include "ps/tensor.h"

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

// Wait and WaitPulls (`op`): every key must have been initialized, or the wait would wait for
// nothing and return as if it had (a mistyped key). `known(key)` says whether Init declared it.
void WaitedKeys(std::string_view store, std::string_view op, std::span<const Key> keys,
                const std::function<bool(Key)>& known);

// Runs work(); a ps::Error from it is rethrown, of the same kind, prefixed "<store>: <op>: ",
// for calls whose errors name no key of their own (SetOptimizer, the checkpoint calls).
void NamingCall(std::string_view store, std::string_view op, const std::function<void()>& work);

// A Push/Pull tensor against what Init declared for the key.
void Matches(std::string_view store, std::string_view op, Key key, const Tensor& t, DType dtype,
             std::size_t size);

// Init: the dtype must be one a server can sum.
void InitDType(std::string_view store, Key key, DType dtype);

// What Init declared for a key, as a store keeps it.
struct Declared {
  DType dtype;
  std::size_t size;  // elements
};
// A store's record of a key (anything with .dtype and .size) as a Declared; nullopt for null.
template <class Record>
std::optional<Declared> DeclaredBy(const Record* record) {
  if (record == nullptr) return std::nullopt;
  return Declared{record->dtype, record->size};
}

// Init, per key in call order: the tensor (TensorBasics, InitDType), then the key is not
// initialized yet (`existing`: its declaration, if it has one) and appears once in the call
// (`repeated`: an earlier key of the call was the same).
void InitKey(std::string_view store, Key key, const Tensor& value,
             const std::optional<Declared>& existing, bool repeated);

// Push, Pull and PushPull.
enum class Op { kPush, kPull, kPushPull };
std::string_view OpName(Op op);

// The checks of one Push, Pull or PushPull. The constructor checks the counts (one tensor per
// key: the sent ones, then the received ones); the store then calls CheckKey(i, declared) for
// every key in call order, from the loop that plans its work, before it sends or changes
// anything. CheckKey checks, in this order: Init declared the key (`declared` holds a value);
// it appears once in the call; the sent tensor, then the received one, match the declaration
// (Matches); with an optimizer set, a pushed key holds float32. `memory` holds the keys seen
// (calls of more than one key only).
class Operation {
 public:
  Operation(std::string_view store, Op op, std::span<const Key> keys, std::span<const Tensor> sends,
            std::span<const Tensor> outs, bool optimizer,
            std::pmr::memory_resource* memory = std::pmr::get_default_resource());
  void CheckKey(std::size_t i, const std::optional<Declared>& declared);

 private:
  std::string_view store_;
  Op op_;
  std::span<const Key> keys_;
  std::span<const Tensor> sends_;
  std::span<const Tensor> outs_;
  bool optimizer_;
  std::pmr::unordered_set<Key> seen_;
};

}  // namespace ps::checks
