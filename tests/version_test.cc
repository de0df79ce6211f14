// eagle3/version.h carries the version of project(eagle3 VERSION ...) (CMake passes it here too).
#include "eagle3/version.h"

#include <string>

#include "gtest/gtest.h"

namespace {

TEST(VersionTest, MacrosMatchTheCMakeProjectVersion) {
  static_assert(EAGLE3_VERSION_MAJOR == EAGLE3_CMAKE_VERSION_MAJOR);
  static_assert(EAGLE3_VERSION_MINOR == EAGLE3_CMAKE_VERSION_MINOR);
  static_assert(EAGLE3_VERSION_PATCH == EAGLE3_CMAKE_VERSION_PATCH);
  static_assert(EAGLE3_VERSION ==
                EAGLE3_CMAKE_VERSION_MAJOR * 10000 + EAGLE3_CMAKE_VERSION_MINOR * 100 + EAGLE3_CMAKE_VERSION_PATCH);
  EXPECT_EQ(std::string(EAGLE3_VERSION_STRING), EAGLE3_CMAKE_VERSION);
  EXPECT_EQ(std::string(EAGLE3_VERSION_STRING),
            std::to_string(EAGLE3_VERSION_MAJOR) + "." + std::to_string(EAGLE3_VERSION_MINOR) + "." +
                std::to_string(EAGLE3_VERSION_PATCH));
}

}  // namespace
