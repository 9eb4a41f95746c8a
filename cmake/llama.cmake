# Imports the pinned llama.cpp built by scripts/llama.sh into a cache prefix.
# LLAMA_PREFIX may be given; otherwise the script is run (it builds on a miss).
option(SPILLWAY_CUDA "Also build llama.cpp's CUDA backend module from the same source (needs nvcc)" OFF)
set(LLAMA_PREFIX "" CACHE PATH "llama.cpp cache prefix from scripts/llama.sh (empty: run the script)")

if(NOT LLAMA_PREFIX)
  set(_env "")
  if(SPILLWAY_CUDA)
    set(_env SPILLWAY_CUDA=1)
  endif()
  message(STATUS "spillway: preparing the pinned llama.cpp (first time: several minutes)")
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env ${_env} ${CMAKE_SOURCE_DIR}/scripts/llama.sh
    OUTPUT_VARIABLE _prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "scripts/llama.sh failed (${_rc})")
  endif()
  set(LLAMA_PREFIX_RESOLVED "${_prefix}")
else()
  set(LLAMA_PREFIX_RESOLVED "${LLAMA_PREFIX}")
endif()
message(STATUS "spillway: llama.cpp at ${LLAMA_PREFIX_RESOLVED}")

set(LLAMA_SRC "${LLAMA_PREFIX_RESOLVED}/src")
set(LLAMA_LIBDIR "${LLAMA_PREFIX_RESOLVED}/build/bin")
set(LLAMA_VOCAB "${LLAMA_SRC}/models/ggml-vocab-llama-spm.gguf")
set(LLAMA_SERVER_BIN "${LLAMA_LIBDIR}/llama-server")
set(LLAMA_BENCH_BIN "${LLAMA_LIBDIR}/llama-bench")

foreach(lib ggml-base ggml llama)
  add_library(llama_${lib} SHARED IMPORTED GLOBAL)
  set_target_properties(llama_${lib} PROPERTIES IMPORTED_LOCATION "${LLAMA_LIBDIR}/lib${lib}.so")
  target_include_directories(llama_${lib} INTERFACE "${LLAMA_SRC}/ggml/include" "${LLAMA_SRC}/include")
endforeach()
target_link_libraries(llama_llama INTERFACE llama_ggml llama_ggml-base)
# llama.cpp's `common` (chat templates, chat parsers, JSON-schema-to-grammar),
# built with llama-server as the shared libllama-common; only src/worker links it.
add_library(llama_common SHARED IMPORTED GLOBAL)
set_target_properties(llama_common PROPERTIES IMPORTED_LOCATION "${LLAMA_LIBDIR}/libllama-common.so")
target_include_directories(llama_common INTERFACE "${LLAMA_SRC}/common")
target_link_libraries(llama_common INTERFACE llama_llama)
target_link_libraries(llama_ggml INTERFACE llama_ggml-base)
# llama-ext.h (memory breakdown) and ggml's backend implementation header are
# not installed headers; only src/worker uses them.
add_library(llama_private INTERFACE)
target_include_directories(llama_private INTERFACE "${LLAMA_SRC}/src" "${LLAMA_SRC}/ggml/src")

# The shared libraries and the backend modules go next to our binaries, so
# $ORIGIN finds them and ggml finds its modules there.
file(GLOB _llama_runtime "${LLAMA_LIBDIR}/lib*.so*")
add_custom_target(llama_runtime ALL
  COMMAND ${CMAKE_COMMAND} -E make_directory "${CMAKE_BINARY_DIR}/bin"
  COMMAND ${CMAKE_COMMAND} -E copy_if_different ${_llama_runtime} "${CMAKE_BINARY_DIR}/bin/"
  COMMENT "Copying llama.cpp runtime libraries")
