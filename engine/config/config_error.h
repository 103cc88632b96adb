// ConfigError: every problem found in one job file, reported together (bad input, exit code 2).
#pragma once

#include <string>
#include <vector>

#include "core/error.h"

namespace zerod {

class ConfigError : public InputError {
 public:
  // `problems` are "json.path: what is wrong" lines. what() is one line per problem, each
  // prefixed with "source: " when a source (the job file) is given.
  explicit ConfigError(std::vector<std::string> problems, const std::string& source = "");

  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

}  // namespace zerod
