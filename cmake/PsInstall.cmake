# Install rules and the CMake package (find_package(ps CONFIG)). Filled in as targets land.
