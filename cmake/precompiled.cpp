// Builds cmake/precompiled.h once (see CMakeLists.txt).
