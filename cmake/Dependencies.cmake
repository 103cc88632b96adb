# Third-party dependencies, found through the config packages Debian ships.
# tools/test.sh installs them (tools/deps.sh lists the Debian packages).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)

# OpenBLAS: Debian's config package sets variables, not a target; wrap them in one.
find_package(OpenBLAS REQUIRED)
if(NOT TARGET zerod::openblas)
  add_library(zerod::openblas INTERFACE IMPORTED)
  set_target_properties(zerod::openblas PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${OpenBLAS_LIBRARIES}")
endif()

if(ZEROD_TESTS)
  find_package(GTest REQUIRED)
endif()
