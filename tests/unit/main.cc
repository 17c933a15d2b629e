// The unit test binary's main(): runs all tests, the named ones, or lists them (check.h).
#define UNIT_MAIN
#include "check.h"
