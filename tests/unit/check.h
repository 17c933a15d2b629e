// A small test harness for hvdlite's C++ unit tests (tests/unit), header-only and
// without dependencies.
//
//   TEST(coordinator_waits_for_every_rank) {
//     CHECK(x > 0);                  // records a failure and goes on
//     CHECK_EQ(resp.names.size(), 2u);
//     CHECK_CONTAINS(resp.error, "disagree on the data type");
//     REQUIRE(!list.responses.empty());  // stops this test on failure
//   }
//
// Each failure is reported as "file:line: what failed". One source file of the binary
// defines UNIT_MAIN before including this header, which gives it a main():
//   unit_tests --list      the test names, one a line
//   unit_tests NAME...     runs the named tests (exit 1 if one fails, 2 for an unknown name)
//   unit_tests             runs every test
#pragma once

#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace unit {

struct TestCase {
  const char* name;
  void (*fn)();
  const char* file;
  int line;
};

inline std::vector<TestCase>& Tests() {
  static std::vector<TestCase> tests;
  return tests;
}

struct Registrar {
  Registrar(const char* name, void (*fn)(), const char* file, int line) {
    Tests().push_back(TestCase{name, fn, file, line});
  }
};

// Failures of the test that is running.
inline int& Failures() {
  static int failures = 0;
  return failures;
}

// Thrown by REQUIRE to end the running test.
struct Abort {};

inline void Fail(const char* file, int line, const std::string& what) {
  ++Failures();
  std::fprintf(stderr, "%s:%d: %s\n", file, line, what.c_str());
  std::fflush(stderr);
}

// Values as failure messages show them: anything that streams, enums as their number,
// vectors element by element, everything else as "<value>".
template <typename T, typename = void>
struct Streams : std::false_type {};
template <typename T>
struct Streams<T, std::void_t<decltype(std::declval<std::ostream&>() << std::declval<const T&>())>>
    : std::true_type {};

template <typename T>
std::string Show(const T& v);

template <typename T>
std::string ShowVectorOrOpaque(const std::vector<T>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + Show(v[i]);
  return s + "}";
}
template <typename T>
std::string ShowVectorOrOpaque(const T&) {
  return "<value>";
}

template <typename T>
std::string Show(const T& v) {
  std::ostringstream os;
  if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, const char*> || std::is_same_v<T, char*>) {
    os << '"' << v << '"';
  } else if constexpr (std::is_enum_v<T>) {
    os << static_cast<long long>(static_cast<std::underlying_type_t<T>>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    os << (v ? "true" : "false");
  } else if constexpr (std::is_same_v<T, signed char> || std::is_same_v<T, unsigned char> ||
                       std::is_same_v<T, char>) {
    os << static_cast<int>(v);
  } else if constexpr (Streams<T>::value) {
    os.precision(17);
    os << v;
  } else {
    return ShowVectorOrOpaque(v);
  }
  return os.str();
}

template <typename T>
bool Negative(T v) {
  if constexpr (std::is_signed_v<T>) return v < 0;
  else return false;
}

template <typename A, typename B>
void CheckEq(const A& a, const B& b, const char* sa, const char* sb, const char* file, int line, bool fatal) {
  bool equal;
  if constexpr (std::is_integral_v<A> && std::is_integral_v<B> && !std::is_same_v<A, bool> &&
                !std::is_same_v<B, bool>) {
    // Compare integers by value, whatever their signedness (size() against a literal).
    equal = Negative(a) == Negative(b) && static_cast<unsigned long long>(a) == static_cast<unsigned long long>(b);
  } else {
    equal = a == b;
  }
  if (equal) return;
  Fail(file, line, std::string("CHECK_EQ(") + sa + ", " + sb + ") failed: " + Show(a) + " != " + Show(b));
  if (fatal) throw Abort{};
}

inline void CheckContains(const std::string& haystack, const std::string& needle, const char* sh, const char* file,
                          int line) {
  if (haystack.find(needle) != std::string::npos) return;
  Fail(file, line, std::string("CHECK_CONTAINS(") + sh + ") failed: \"" + haystack + "\" does not contain \"" +
                       needle + "\"");
}

// Runs one test; true when it passed.
inline bool Run(const TestCase& t) {
  Failures() = 0;
  try {
    t.fn();
  } catch (const Abort&) {
    // REQUIRE failed and said so.
  } catch (const std::exception& e) {
    Fail(t.file, t.line, std::string("uncaught exception: ") + e.what());
  } catch (...) {
    Fail(t.file, t.line, "uncaught exception of unknown type");
  }
  return Failures() == 0;
}

inline int Main(int argc, char** argv) {
  std::vector<const TestCase*> selected;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0) {
      for (const TestCase& t : Tests()) std::printf("%s\n", t.name);
      return 0;
    }
    const TestCase* found = nullptr;
    for (const TestCase& t : Tests())
      if (std::strcmp(t.name, argv[i]) == 0) found = &t;
    if (!found) {
      std::fprintf(stderr, "no test named '%s' (--list shows them)\n", argv[i]);
      return 2;
    }
    selected.push_back(found);
  }
  if (selected.empty())
    for (const TestCase& t : Tests()) selected.push_back(&t);
  int failed = 0;
  for (const TestCase* t : selected) {
    const bool ok = Run(*t);
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", t->name);
    std::fflush(stdout);
    if (!ok) ++failed;
  }
  std::printf("%zu tests, %d failed\n", selected.size(), failed);
  return failed ? 1 : 0;
}

}  // namespace unit

#define UNIT_CONCAT2(a, b) a##b
#define UNIT_CONCAT(a, b) UNIT_CONCAT2(a, b)

// Defines and registers a test; `name` must be unique in the binary.
#define TEST(name)                                                                         \
  static void unit_test_##name();                                                          \
  static ::unit::Registrar UNIT_CONCAT(unit_registrar_, name)(#name, &unit_test_##name,    \
                                                              __FILE__, __LINE__);         \
  static void unit_test_##name()

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) ::unit::Fail(__FILE__, __LINE__, "CHECK(" #cond ") failed");    \
  } while (0)

#define REQUIRE(cond)                                                            \
  do {                                                                           \
    if (!(cond)) {                                                               \
      ::unit::Fail(__FILE__, __LINE__, "REQUIRE(" #cond ") failed");             \
      throw ::unit::Abort{};                                                     \
    }                                                                            \
  } while (0)

#define CHECK_EQ(a, b) ::unit::CheckEq((a), (b), #a, #b, __FILE__, __LINE__, false)
#define REQUIRE_EQ(a, b) ::unit::CheckEq((a), (b), #a, #b, __FILE__, __LINE__, true)
#define CHECK_CONTAINS(haystack, needle) \
  ::unit::CheckContains((haystack), (needle), #haystack ", " #needle, __FILE__, __LINE__)

// `stmt` throws an exception of type `type` (a std::exception) whose what() contains `needle`.
#define CHECK_THROWS(stmt, type, needle)                                                               \
  do {                                                                                                 \
    bool unit_threw_ = false;                                                                          \
    try {                                                                                              \
      stmt;                                                                                            \
    } catch (const type& e) {                                                                          \
      unit_threw_ = true;                                                                              \
      ::unit::CheckContains(e.what(), (needle), "what() of " #stmt, __FILE__, __LINE__);               \
    }                                                                                                  \
    if (!unit_threw_) ::unit::Fail(__FILE__, __LINE__, "CHECK_THROWS(" #stmt ", " #type ") did not throw"); \
  } while (0)

#ifdef UNIT_MAIN
int main(int argc, char** argv) { return ::unit::Main(argc, argv); }
#endif
