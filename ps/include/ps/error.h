#pragma once
// The one exception type the library throws for anything a user or a peer can cause.
#include <stdexcept>
#include <string>

namespace ps {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace ps
