# ps_warnings(target): the warning set every target of ours builds with.
add_library(ps_warnings INTERFACE)
target_compile_options(ps_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wold-style-cast -Wcast-align -Woverloaded-virtual -Werror>)

if(PS_SANITIZE)
  message(STATUS "ps: building with -fsanitize=${PS_SANITIZE}")
  add_compile_options(-fsanitize=${PS_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${PS_SANITIZE})
endif()
