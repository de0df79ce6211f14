// Running the example programs from tests: the exit code and the captured output of one run.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "scoped_temp_dir.h"

namespace eagle3 {

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct ToolRun {
  int exit_code = -1;
  std::string log;  // stdout and stderr
};

// Runs `program args` with its output captured in `dir`; `timeout` bounds the run so that a hang
// fails the test instead of stalling it.
inline ToolRun RunTool(const std::string& program, const std::string& args, const ScopedTempDir& dir) {
  const std::string log = dir.File("log.txt");
  const std::string command = "timeout 120 " + program + " " + args + " > " + log + " 2>&1";
  const int status = std::system(command.c_str());
  return ToolRun{WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFile(log)};
}

}  // namespace eagle3
