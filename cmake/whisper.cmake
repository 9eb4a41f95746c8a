# Imports whisper.cpp's whisper-server built by scripts/whisper.sh into a cache
# prefix: a second kind of service for tests (tests/integration/whisper_test.cpp).
# WHISPER_PREFIX may be given; otherwise the script is run (it builds on a miss).
# -DSPILLWAY_WHISPER=OFF skips it, and the tests that need it skip; a build without the
# tests (SPILLWAY_TESTS=OFF, make run's) skips it too.
option(SPILLWAY_WHISPER "Build whisper.cpp's whisper-server (scripts/whisper.sh) for the tests" ON)
set(WHISPER_PREFIX "" CACHE PATH "whisper.cpp cache prefix from scripts/whisper.sh (empty: run the script)")

set(WHISPER_SERVER_BIN "")
if(SPILLWAY_WHISPER AND SPILLWAY_TESTS)
  if(NOT WHISPER_PREFIX)
    message(STATUS "spillway: preparing the pinned whisper.cpp (first time: several minutes)")
    execute_process(
      COMMAND ${CMAKE_SOURCE_DIR}/scripts/whisper.sh
      OUTPUT_VARIABLE _whisper_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "scripts/whisper.sh failed (${_rc}); -DSPILLWAY_WHISPER=OFF builds without it")
    endif()
  else()
    set(_whisper_prefix "${WHISPER_PREFIX}")
  endif()
  message(STATUS "spillway: whisper.cpp at ${_whisper_prefix}")
  set(WHISPER_SRC "${_whisper_prefix}/src")
  set(WHISPER_LIBDIR "${_whisper_prefix}/build/bin")
  set(WHISPER_SERVER_BIN "${WHISPER_LIBDIR}/whisper-server")
endif()
