// What a piece of code writes to stderr, where the engine's log messages go.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>

namespace unit {

inline std::string StderrOf(const std::function<void()>& fn) {
  std::fflush(stderr);
  std::FILE* tmp = std::tmpfile();
  if (!tmp) throw std::runtime_error("StderrOf: no temporary file");
  const int saved = dup(2);
  dup2(fileno(tmp), 2);
  try {
    fn();
  } catch (...) {
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::fclose(tmp);
    throw;
  }
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string text;
  std::rewind(tmp);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, tmp)) > 0) text.append(buf, n);
  std::fclose(tmp);
  return text;
}

}  // namespace unit
