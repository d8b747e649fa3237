# ps_warnings(target): the warning set every target of ours builds with.
add_library(ps_warnings INTERFACE)
target_compile_options(ps_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wold-style-cast -Wcast-align -Woverloaded-virtual -Werror>
  # GCC 12 at -O3 (Release) reports -Wrestrict inside libstdc++'s own string concatenation
  # (GCC bug 105329, fixed in 13): a false positive that would stop every Release build.
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-restrict>)

# The lock contracts (PS_GUARDED_BY, PS_REQUIRES, ... on ps/mutex.h's mutexes), checked by
# clang's thread-safety analysis; with -Werror above, a broken contract fails the build. Only
# clang has the analysis (the preset clang-thread-safety, docs/testing.md).
if(PS_THREAD_SAFETY_ANALYSIS)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(STATUS "ps: checking lock annotations with -Wthread-safety")
    target_compile_options(ps_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety>)
  else()
    message(WARNING "PS_THREAD_SAFETY_ANALYSIS needs clang (CMAKE_CXX_COMPILER=clang++); "
                    "${CMAKE_CXX_COMPILER_ID} has no thread-safety analysis: not checked")
  endif()
endif()

if(PS_SANITIZE)
  message(STATUS "ps: building with -fsanitize=${PS_SANITIZE}")
  add_compile_options(-fsanitize=${PS_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${PS_SANITIZE})
endif()
