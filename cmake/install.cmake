# `make install PREFIX=...` / `cmake --install build --prefix ...` (DESTDIR honoured):
#
#   bin/spillway                               the CLI and gateway (RUNPATH $ORIGIN/../lib/spillway)
#   lib/spillway/spillway-worker               found by the gateway there (cli/serve_config.h)
#   lib/spillway/spillway-tie                  external servers start through it (upstream/tie_main.cpp)
#   lib/spillway/lib{llama,ggml,...}.so*       llama.cpp's libraries and backend modules (RUNPATH $ORIGIN)
#   lib/spillway/libggml-sim.so                the simulated accelerator's module
#   lib/systemd/system/spillway.service        the unit, with this prefix written in at install time
#   lib/sysusers.d/spillway.conf               the service user and the GPU groups
#   share/spillway/models/demo-*.gguf          the built-in demo's models (`spillway serve` without --config)
#   share/spillway/spillway.example.toml       a commented config (`spillway init` writes a real one)
#
# Nothing installed refers to the build tree or to the llama.cpp cache.

set(_pkglib "${SPILLWAY_INSTALL_PKGLIBDIR}")

# First, before anything is copied: a prefix the unit cannot name is refused.
install(CODE [[
  if(NOT IS_ABSOLUTE "${CMAKE_INSTALL_PREFIX}")
    message(FATAL_ERROR "spillway: the install prefix must be an absolute path, not '${CMAKE_INSTALL_PREFIX}'")
  endif()
  if(CMAKE_INSTALL_PREFIX MATCHES "[ \t\n\"'\\\\$%;]")
    message(FATAL_ERROR "spillway: the install prefix '${CMAKE_INSTALL_PREFIX}' holds a space, quote, backslash, "
                        "$, % or ; that the systemd unit's ExecStart= would misread; choose another")
  endif()
]])

set_target_properties(spillway PROPERTIES INSTALL_RPATH "$ORIGIN/../${_pkglib}")
set_target_properties(spillway-worker ggml-sim PROPERTIES INSTALL_RPATH "$ORIGIN")
install(TARGETS spillway RUNTIME DESTINATION bin)
install(TARGETS spillway-worker spillway-tie RUNTIME DESTINATION "${_pkglib}")
install(TARGETS ggml-sim LIBRARY DESTINATION "${_pkglib}")

# llama.cpp's runtime from its cache prefix (symbolic links kept): what the
# binaries link and the backend modules the worker loads; not llama-server's
# and llama-bench's own libraries.
file(GLOB _llama_install "${LLAMA_LIBDIR}/lib*.so*")
list(FILTER _llama_install EXCLUDE REGEX "/lib(llama-server-impl|llama-bench-impl|mtmd)\\.so")
install(FILES ${_llama_install} DESTINATION "${_pkglib}")
# They were linked with the cache's folder as their RUNPATH: the installed
# copies find each other beside themselves instead (those with none need none).
install(CODE "
  file(GLOB _libs \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${_pkglib}/lib*.so*\")
  foreach(_lib \${_libs})
    if(NOT IS_SYMLINK \"\${_lib}\")
      file(READ_ELF \"\${_lib}\" RUNPATH _runpath RPATH _rpath)
      if(_runpath OR _rpath)
        file(RPATH_SET FILE \"\${_lib}\" NEW_RPATH \"\$ORIGIN\")
      endif()
    endif()
  endforeach()
")

install(FILES "${CMAKE_BINARY_DIR}/models/demo-chat.gguf" "${CMAKE_BINARY_DIR}/models/demo-embed.gguf"
        DESTINATION "${SPILLWAY_INSTALL_DATADIR}/models")
install(FILES "${CMAKE_SOURCE_DIR}/packaging/spillway.example.toml" DESTINATION "${SPILLWAY_INSTALL_DATADIR}")
install(FILES "${CMAKE_SOURCE_DIR}/packaging/spillway-sysusers.conf" DESTINATION lib/sysusers.d
        RENAME spillway.conf)

# The unit names the prefix given at install time (`cmake --install --prefix`
# may differ from the configured one), not the DESTDIR it is staged in.
install(CODE "
  set(PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(PKGLIBDIR \"\${CMAKE_INSTALL_PREFIX}/${_pkglib}\")
  file(READ \"${CMAKE_SOURCE_DIR}/packaging/spillway.service.in\" _unit)
  string(CONFIGURE \"\${_unit}\" _unit @ONLY)
  file(WRITE \"${CMAKE_BINARY_DIR}/packaging/spillway.service\" \"\${_unit}\")
  file(INSTALL \"${CMAKE_BINARY_DIR}/packaging/spillway.service\" DESTINATION \"\${CMAKE_INSTALL_PREFIX}/lib/systemd/system\")
")
install(FILES "${CMAKE_SOURCE_DIR}/README.md" DESTINATION share/doc/spillway)
install(FILES "${CMAKE_SOURCE_DIR}/docs/DESIGN.md" "${CMAKE_SOURCE_DIR}/docs/BENCHMARKS.md"
              "${CMAKE_SOURCE_DIR}/docs/dashboard-degraded.png" DESTINATION share/doc/spillway/docs)
