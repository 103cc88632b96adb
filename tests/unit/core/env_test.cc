// env_switch (core/env.h): unset and empty give the default, "1" and "0" switch, anything else is
// bad input naming the variable and the value.
#include "core/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace zerod {
namespace {

TEST(EnvSwitch, DefaultOnOffAndBadValues) {
  const char* name = "ZEROD_ENV_SWITCH_TEST";
  ::unsetenv(name);
  EXPECT_TRUE(env_switch(name, true));
  EXPECT_FALSE(env_switch(name, false));
  ::setenv(name, "", 1);
  EXPECT_TRUE(env_switch(name, true));
  ::setenv(name, "1", 1);
  EXPECT_TRUE(env_switch(name, false));
  ::setenv(name, "0", 1);
  EXPECT_FALSE(env_switch(name, true));
  for (const char* bad : {"2", "yes", "01", " 1"}) {
    ::setenv(name, bad, 1);
    try {
      env_switch(name, true);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(name), std::string::npos) << what;
      EXPECT_NE(what.find(bad), std::string::npos) << what;
    }
  }
  ::unsetenv(name);
}

TEST(EnvCount, UnsetGivesTheDefaultAndBadValuesNameTheVariable) {
  EXPECT_EQ(env_count("ZEROD_X", nullptr, 0, 16, 2, "things"), 2);
  EXPECT_EQ(env_count("ZEROD_X", "", 0, 16, 2, "things"), 2);
  EXPECT_EQ(env_count("ZEROD_X", "0", 0, 16, 2, "things"), 0);
  EXPECT_EQ(env_count("ZEROD_X", "16", 0, 16, 2, "things"), 16);
  for (const char* bad : {"-1", "17", "3x", "x"}) {
    try {
      env_count("ZEROD_X", bad, 0, 16, 2, "things");
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("ZEROD_X='" + std::string(bad) + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("things, 0 to 16"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace zerod
